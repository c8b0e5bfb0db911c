// Embedding, GELU, residual and column-sum kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "tandem/compute/cpu/cpu_kernels.h"

namespace tandem::cpu {
namespace {
// Columns per work item of a column reduction: one 64-byte cache line of floats, so
// threads never share a line of the output.
constexpr int kColumnBlock = 16;
}  // namespace

void column_sums_accumulate(float* sum, const float* x, int N, int C) {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * kColumnBlock;
    const int c1 = std::min(C, c0 + kColumnBlock);
    float acc[kColumnBlock] = {};
    for (int n = 0; n < N; n++) {
      const float* row = x + static_cast<size_t>(n) * C;
      for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
    }
    for (int c = c0; c < c1; c++) sum[c] += acc[c - c0];
  }
}

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const float* tok = wte + static_cast<size_t>(tokens[b * T + t]) * C;
      const float* pos = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
    }
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C) {
  // dwpe: each position sums over the batch, b in order.
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    float* dpos = dwpe + static_cast<size_t>(t) * C;
    for (int b = 0; b < B; b++) {
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
      for (int c = 0; c < C; c++) dpos[c] += d[c];
    }
  }
  // dwte: a scatter-add by token id. Parallel over column blocks, positions in order,
  // so that repeated tokens add up in the same order whatever the thread count.
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * kColumnBlock;
    const int c1 = std::min(C, c0 + kColumnBlock);
    for (int bt = 0; bt < B * T; bt++) {
      float* drow = dwte + static_cast<size_t>(tokens[bt]) * C;
      const float* d = dout + static_cast<size_t>(bt) * C;
      for (int c = c0; c < c1; c++) drow[c] += d[c];
    }
  }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
}

void gelu_forward(float* out, const float* inp, size_t N) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + cube)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float tanh_arg = kGeluScale * (x + cube);
    const float tanh_out = std::tanh(tanh_arg);
    const float cosh_out = std::cosh(tanh_arg);
    const float sech_sq = 1.0f / (cosh_out * cosh_out);
    const float grad = 0.5f * (1.0f + tanh_out) +
                       x * 0.5f * sech_sq * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = grad * dout[i];
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t N) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

}  // namespace tandem::cpu
