#include "tandem/compute/cpu/bf16_kernels.h"

#include <algorithm>
#include <vector>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/compute/cpu/sum_of_squares.h"

namespace tandem::cpu {
namespace {

// An fp32 copy of x[n] (empty for a null x, whose data() is then null too).
std::vector<float> widen(const Bf16* x, size_t n) {
  if (x == nullptr) return {};
  std::vector<float> wide(n);
  for (size_t i = 0; i < n; i++) wide[i] = to_float(x[i]);
  return wide;
}

// dst[n] = src rounded to bf16; nothing for a null dst.
void narrow(Bf16* dst, const std::vector<float>& src) {
  if (dst == nullptr) return;
  for (size_t i = 0; i < src.size(); i++) dst[i] = from_float<Bf16>(src[i]);
}

float* data_or_null(std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// Rows of the token embedding that tokens[n] can touch: 0 .. max token.
size_t embedding_rows(const int32_t* tokens, size_t n) {
  int32_t max_token = 0;
  for (size_t i = 0; i < n; i++) max_token = std::max(max_token, tokens[i]);
  return static_cast<size_t>(max_token) + 1;
}

}  // namespace

double sum_of_squares(ThreadPool& pool, const Bf16* x, size_t n) {
  const std::vector<float> wide = widen(x, n);
  return tandem::sum_of_squares(pool, wide.data(), n);
}

void sum_of_squares_blocks(ThreadPool& pool, const Bf16* x, size_t n, double* partials) {
  const std::vector<float> wide = widen(x, n);
  tandem::sum_of_squares_blocks(pool, wide.data(), n, partials);
}

void encoder_forward(ThreadPool& pool, Bf16* out, const int32_t* tokens, const Bf16* wte,
                     const Bf16* wpe, int B, int T, int C) {
  const size_t BT = static_cast<size_t>(B) * T;
  const std::vector<float> wte32 = widen(wte, embedding_rows(tokens, BT) * C);
  std::vector<float> wpe32 = widen(wpe, static_cast<size_t>(T) * C);
  std::vector<float> out32(BT * C);
  cpu::encoder_forward(pool, out32.data(), tokens, wte32.data(), data_or_null(wpe32), B, T, C);
  narrow(out, out32);
}

void encoder_backward(ThreadPool& pool, Bf16* dwte, Bf16* dwpe, const Bf16* dout,
                      const int32_t* tokens, int B, int T, int C) {
  const size_t BT = static_cast<size_t>(B) * T;
  // Accumulating outputs: widen, add in fp32, round once. Rows no token touches
  // round-trip unchanged (bf16 -> fp32 -> bf16 is exact).
  std::vector<float> dwte32 = widen(dwte, embedding_rows(tokens, BT) * C);
  std::vector<float> dwpe32 = widen(dwpe, static_cast<size_t>(T) * C);
  const std::vector<float> dout32 = widen(dout, BT * C);
  cpu::encoder_backward(pool, dwte32.data(), data_or_null(dwpe32), dout32.data(), tokens, B, T, C);
  narrow(dwte, dwte32);
  narrow(dwpe, dwpe32);
}

void layernorm_forward(ThreadPool& pool, Bf16* out, float* mean, float* rstd, const Bf16* inp,
                       const Bf16* weight, const Bf16* bias, int N, int C) {
  const std::vector<float> inp32 = widen(inp, static_cast<size_t>(N) * C);
  const std::vector<float> weight32 = widen(weight, C), bias32 = widen(bias, C);
  std::vector<float> out32(static_cast<size_t>(N) * C);
  cpu::layernorm_forward(pool, out32.data(), mean, rstd, inp32.data(), weight32.data(),
                         bias32.data(), N, C);
  narrow(out, out32);
}

void layernorm_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout,
                        const Bf16* inp, const Bf16* weight, const float* mean, const float* rstd,
                        int N, int C) {
  const size_t NC = static_cast<size_t>(N) * C;
  std::vector<float> dinp32 = widen(dinp, NC), dweight32 = widen(dweight, C),
                     dbias32 = widen(dbias, C);
  const std::vector<float> dout32 = widen(dout, NC), inp32 = widen(inp, NC),
                           weight32 = widen(weight, C);
  cpu::layernorm_backward(pool, dinp32.data(), dweight32.data(), dbias32.data(), dout32.data(),
                          inp32.data(), weight32.data(), mean, rstd, N, C);
  narrow(dinp, dinp32);
  narrow(dweight, dweight32);
  narrow(dbias, dbias32);
}

void matmul_forward(ThreadPool& pool, Bf16* out, const Bf16* inp, const Bf16* weight,
                    const Bf16* bias, int N, int C, int OC) {
  const std::vector<float> inp32 = widen(inp, static_cast<size_t>(N) * C);
  const std::vector<float> weight32 = widen(weight, static_cast<size_t>(OC) * C);
  std::vector<float> bias32 = widen(bias, OC);
  std::vector<float> out32(static_cast<size_t>(N) * OC);
  cpu::matmul_forward(pool, out32.data(), inp32.data(), weight32.data(), data_or_null(bias32), N, C,
                      OC);
  narrow(out, out32);
}

void matmul_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout,
                     const Bf16* inp, const Bf16* weight, int N, int C, int OC) {
  std::vector<float> dinp32(static_cast<size_t>(N) * C);
  std::vector<float> dweight32 = widen(dweight, static_cast<size_t>(OC) * C);
  std::vector<float> dbias32 = widen(dbias, OC);
  const std::vector<float> dout32 = widen(dout, static_cast<size_t>(N) * OC);
  const std::vector<float> inp32 = widen(inp, static_cast<size_t>(N) * C);
  const std::vector<float> weight32 = widen(weight, static_cast<size_t>(OC) * C);
  cpu::matmul_backward(pool, dinp32.data(), dweight32.data(), data_or_null(dbias32), dout32.data(),
                       inp32.data(), weight32.data(), N, C, OC);
  narrow(dinp, dinp32);
  narrow(dweight, dweight32);
  narrow(dbias, dbias32);
}

void rmsnorm_forward(ThreadPool& pool, Bf16* out, float* rstd, const Bf16* inp, const Bf16* weight,
                     float eps, int N, int C) {
  const std::vector<float> inp32 = widen(inp, static_cast<size_t>(N) * C),
                           weight32 = widen(weight, C);
  std::vector<float> out32(static_cast<size_t>(N) * C);
  cpu::rmsnorm_forward(pool, out32.data(), rstd, inp32.data(), weight32.data(), eps, N, C);
  narrow(out, out32);
}

void rmsnorm_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, const Bf16* dout,
                      const Bf16* inp, const Bf16* weight, const float* rstd, int N, int C) {
  const size_t NC = static_cast<size_t>(N) * C;
  std::vector<float> dinp32 = widen(dinp, NC), dweight32 = widen(dweight, C);
  const std::vector<float> dout32 = widen(dout, NC), inp32 = widen(inp, NC),
                           weight32 = widen(weight, C);
  cpu::rmsnorm_backward(pool, dinp32.data(), dweight32.data(), dout32.data(), inp32.data(),
                        weight32.data(), rstd, N, C);
  narrow(dinp, dinp32);
  narrow(dweight, dweight32);
}

// The heads' rows span N - 1 whole rows and the last row's H heads; columns of those rows
// outside the heads are widened and narrowed unchanged (bf16 -> fp32 -> bf16 is exact).
void head_rmsnorm_forward(ThreadPool& pool, Bf16* out, float* rstd, const Bf16* inp,
                          const Bf16* weight, float eps, int N, int H, int HS, int row_stride) {
  if (N == 0) return;
  const size_t span = static_cast<size_t>(N - 1) * row_stride + static_cast<size_t>(H) * HS;
  const std::vector<float> inp32 = widen(inp, span), weight32 = widen(weight, HS);
  std::vector<float> out32 = widen(out, span);
  cpu::head_rmsnorm_forward(pool, out32.data(), rstd, inp32.data(), weight32.data(), eps, N, H, HS,
                            row_stride);
  narrow(out, out32);
}

void head_rmsnorm_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, const Bf16* dout,
                           const Bf16* inp, const Bf16* weight, const float* rstd, int N, int H,
                           int HS, int row_stride) {
  if (N == 0) return;
  const size_t span = static_cast<size_t>(N - 1) * row_stride + static_cast<size_t>(H) * HS;
  std::vector<float> dinp32 = widen(dinp, span), dweight32 = widen(dweight, HS);
  const std::vector<float> dout32 = widen(dout, span), inp32 = widen(inp, span),
                           weight32 = widen(weight, HS);
  cpu::head_rmsnorm_backward(pool, dinp32.data(), dweight32.data(), dout32.data(), inp32.data(),
                             weight32.data(), rstd, N, H, HS, row_stride);
  narrow(dinp, dinp32);
  narrow(dweight, dweight32);
}

void attention_forward(ThreadPool& pool, Bf16* out, float* lse, const Bf16* qkv, int B, int T,
                       int NH, int KVH, int HS) {
  const size_t BT = static_cast<size_t>(B) * T;
  const std::vector<float> qkv32 = widen(qkv, BT * (NH + 2 * KVH) * HS);
  std::vector<float> out32(BT * NH * HS);
  cpu::attention_forward(pool, out32.data(), lse, qkv32.data(), B, T, NH, KVH, HS);
  narrow(out, out32);
}

void attention_backward(ThreadPool& pool, Bf16* dqkv, const Bf16* dout, const Bf16* qkv,
                        const Bf16* out, const float* lse, int B, int T, int NH, int KVH, int HS) {
  const size_t BT = static_cast<size_t>(B) * T;
  const size_t width = static_cast<size_t>(NH + 2 * KVH) * HS;
  const std::vector<float> dout32 = widen(dout, BT * NH * HS), qkv32 = widen(qkv, BT * width),
                           out32 = widen(out, BT * NH * HS);
  std::vector<float> dqkv32(BT * width);
  cpu::attention_backward(pool, dqkv32.data(), dout32.data(), qkv32.data(), out32.data(), lse, B, T,
                          NH, KVH, HS);
  narrow(dqkv, dqkv32);
}

// In place: the value heads round-trip unchanged (bf16 -> fp32 -> bf16 is exact).
void rope_forward(ThreadPool& pool, Bf16* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                  int HS) {
  std::vector<float> qkv32 = widen(qkv, static_cast<size_t>(B) * T * (NH + 2 * KVH) * HS);
  cpu::rope_forward(pool, qkv32.data(), cos_sin, B, T, NH, KVH, HS);
  narrow(qkv, qkv32);
}

void rope_backward(ThreadPool& pool, Bf16* dqkv, const float* cos_sin, int B, int T, int NH,
                   int KVH, int HS) {
  std::vector<float> dqkv32 = widen(dqkv, static_cast<size_t>(B) * T * (NH + 2 * KVH) * HS);
  cpu::rope_backward(pool, dqkv32.data(), cos_sin, B, T, NH, KVH, HS);
  narrow(dqkv, dqkv32);
}

void swiglu_forward(ThreadPool& pool, Bf16* out, const Bf16* inp, int N, int I) {
  const std::vector<float> inp32 = widen(inp, static_cast<size_t>(N) * 2 * I);
  std::vector<float> out32(static_cast<size_t>(N) * I);
  cpu::swiglu_forward(pool, out32.data(), inp32.data(), N, I);
  narrow(out, out32);
}

void swiglu_backward(ThreadPool& pool, Bf16* dinp, const Bf16* inp, const Bf16* dout, int N,
                     int I) {
  const std::vector<float> inp32 = widen(inp, static_cast<size_t>(N) * 2 * I),
                           dout32 = widen(dout, static_cast<size_t>(N) * I);
  std::vector<float> dinp32(static_cast<size_t>(N) * 2 * I);
  cpu::swiglu_backward(pool, dinp32.data(), inp32.data(), dout32.data(), N, I);
  narrow(dinp, dinp32);
}

void gelu_forward(ThreadPool& pool, Bf16* out, const Bf16* inp, size_t N) {
  const std::vector<float> inp32 = widen(inp, N);
  std::vector<float> out32(N);
  cpu::gelu_forward(pool, out32.data(), inp32.data(), N);
  narrow(out, out32);
}

void gelu_backward(ThreadPool& pool, Bf16* dinp, const Bf16* inp, const Bf16* dout, size_t N) {
  const std::vector<float> inp32 = widen(inp, N), dout32 = widen(dout, N);
  std::vector<float> dinp32(N);
  cpu::gelu_backward(pool, dinp32.data(), inp32.data(), dout32.data(), N);
  narrow(dinp, dinp32);
}

void residual_forward(ThreadPool& pool, Bf16* out, const Bf16* a, const Bf16* b, size_t N) {
  const std::vector<float> a32 = widen(a, N), b32 = widen(b, N);
  std::vector<float> out32(N);
  cpu::residual_forward(pool, out32.data(), a32.data(), b32.data(), N);
  narrow(out, out32);
}

void cross_entropy_forward(ThreadPool& pool, float* losses, const Bf16* logits,
                           const int32_t* targets, int N, int V) {
  const std::vector<float> logits32 = widen(logits, static_cast<size_t>(N) * V);
  cpu::cross_entropy_forward(pool, losses, logits32.data(), targets, N, V);
}

void cross_entropy_backward(ThreadPool& pool, Bf16* dlogits, const Bf16* logits,
                            const int32_t* targets, float dloss, int N, int V) {
  const std::vector<float> logits32 = widen(logits, static_cast<size_t>(N) * V);
  std::vector<float> dlogits32(static_cast<size_t>(N) * V);
  cpu::cross_entropy_backward(pool, dlogits32.data(), logits32.data(), targets, dloss, N, V);
  narrow(dlogits, dlogits32);
}

}  // namespace tandem::cpu
