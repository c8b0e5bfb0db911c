// The CUDA compute backend against the CPU one (skipped, with the reason, where there is
// no GPU): every kernel on random data with fp32 and with bf16 storage (Llama's RMSNorm,
// RoPE, SwiGLU and grouped-query attention included), flash attention over several tiles,
// the bf16 matmuls against the fp32 ones, a tiny GPT-2's and a tiny Llama's loss and
// gradients, 50 training steps on the bundled data, and every update schedule
// bit-identical on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "support/block_sums_check.h"
#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/config/memory_plan.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"
#include "tandem/data/loss_mask.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/model/gpt.h"
#include "tandem/model/llama.h"
#include "tandem/model/model_family.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

using testing::randn;
using testing::stored;

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    std::string why;                                                               \
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why; \
  } while (0)

// The same arrays on both backends.
struct Twin {
  ComputeBackend& cpu;
  ComputeBackend& gpu;
  std::vector<Buffer> keep;

  template <typename T>
  std::pair<T*, T*> upload(const std::vector<T>& host) {
    const size_t bytes = host.size() * sizeof(T);
    keep.push_back(cpu.allocate(bytes));
    T* a = keep.back().as<T>();
    keep.push_back(gpu.allocate(bytes));
    T* b = keep.back().as<T>();
    cpu.copy_from_host(a, host.data(), bytes);
    gpu.copy_from_host(b, host.data(), bytes);
    return {a, b};
  }
  std::pair<float*, float*> floats(const std::vector<float>& host) { return upload(host); }
  std::pair<int32_t*, int32_t*> ints(const std::vector<int32_t>& host) { return upload(host); }

  // Expects the two results to agree within rel * max|cpu| + 1e-6 (compared as fp32).
  template <typename T>
  void expect_near(std::pair<T*, T*> x, size_t n, double rel, const char* what) {
    std::vector<T> a(n), b(n);
    cpu.copy_to_host(a.data(), x.first, n * sizeof(T));
    gpu.copy_to_host(b.data(), x.second, n * sizeof(T));
    double scale = 0;
    for (const T& v : a) scale = std::max(scale, std::fabs(static_cast<double>(to_float(v))));
    for (size_t i = 0; i < n; i++)
      ASSERT_NEAR(to_float(a[i]), to_float(b[i]), rel * scale + 1e-6) << what << "[" << i << "]";
  }
};

struct Sizes {
  int B, T, C, NH;
  int KVH;  // key/value heads of the grouped-query attention and RoPE cases
  int V, OC;
  bool attention;  // flash attention wants a head size it supports
};

// Every kernel with tensors stored as Elem, on random data, GPU against CPU: within
// rel * max|cpu|, attention_backward within attention_rel, residual_forward exactly (one
// fp32 add, rounded once, on both). Rows of V = 50 or 37 logits start off 16-byte
// boundaries; C = 30 leaves rows unaligned for every 16-byte vector path, and the views
// one element in do the same for the elementwise kernels and sum_of_squares.
template <typename Elem>
void expect_every_kernel_matches(const Sizes& s, double rel, double attention_rel) {
  SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " C " << s.C << " V " << s.V
                                    << " OC " << s.OC << (sizeof(Elem) == 2 ? " bf16" : " fp32"));
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  Twin t{*cpu, *gpu, {}};
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, V = s.V, OC = s.OC, N = B * T;
  const auto data = [](size_t n, uint64_t seed, float scale = 1.0f) {
    return stored<Elem>(randn(n, seed, scale));
  };
  const auto zeros = [](size_t n) { return std::vector<Elem>(n); };
  Rng rng(1);
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % V);
    targets[i] = static_cast<int32_t>(rng.next_u64() % V);
  }
  tokens[N - 1] = tokens[N - 2] = tokens[0];  // a token at three positions
  targets[1] = kIgnoredTarget;  // a position the loss does not count: loss 0, zero gradient
  const auto tok = t.ints(tokens), tgt = t.ints(targets);
  const auto wte = t.upload(data(V * C, 2)), wpe = t.upload(data(T * C, 3));
  const auto x = t.upload(data(N * C, 4)), dout = t.upload(data(N * C, 5));
  const auto out = t.upload(zeros(N * C)), out2 = t.upload(zeros(N * C));

  cpu->kernels<Elem>().encoder_forward(out.first, tok.first, wte.first, wpe.first, B, T, C);
  gpu->kernels<Elem>().encoder_forward(out.second, tok.second, wte.second, wpe.second, B, T, C);
  t.expect_near(out, N * C, rel, "encoder_forward");
  // Accumulates onto non-zero gradients; the repeated token's row adds three positions.
  const auto dwte = t.upload(data(V * C, 20, 0.1f)), dwpe = t.upload(data(T * C, 21, 0.1f));
  cpu->kernels<Elem>().encoder_backward(dwte.first, dwpe.first, dout.first, tok.first, B, T, C);
  gpu->kernels<Elem>().encoder_backward(dwte.second, dwpe.second, dout.second, tok.second, B, T, C);
  t.expect_near(dwte, V * C, rel, "encoder_backward dwte");
  t.expect_near(dwpe, T * C, rel, "encoder_backward dwpe");
  // Without a position embedding (Llama): wpe and dwpe null.
  cpu->kernels<Elem>().encoder_forward(out.first, tok.first, wte.first, nullptr, B, T, C);
  gpu->kernels<Elem>().encoder_forward(out.second, tok.second, wte.second, nullptr, B, T, C);
  t.expect_near(out, N * C, 0, "encoder_forward without wpe");
  cpu->kernels<Elem>().encoder_backward(dwte.first, nullptr, dout.first, tok.first, B, T, C);
  gpu->kernels<Elem>().encoder_backward(dwte.second, nullptr, dout.second, tok.second, B, T, C);
  t.expect_near(dwte, V * C, rel, "encoder_backward without dwpe");

  const auto w = t.upload(data(C, 6, 0.5f)), b = t.upload(data(C, 7, 0.5f));
  const auto mean = t.floats(std::vector<float>(N)), rstd = t.floats(std::vector<float>(N));
  cpu->kernels<Elem>().layernorm_forward(out.first, mean.first, rstd.first, x.first, w.first,
                                         b.first, N, C);
  gpu->kernels<Elem>().layernorm_forward(out.second, mean.second, rstd.second, x.second, w.second,
                                         b.second, N, C);
  t.expect_near(out, N * C, rel, "layernorm_forward");
  t.expect_near(mean, N, rel, "layernorm_forward mean");
  t.expect_near(rstd, N, rel, "layernorm_forward rstd");
  const auto dx = t.upload(data(N * C, 22));
  const auto dw = t.upload(data(C, 23, 0.1f)), db = t.upload(data(C, 24, 0.1f));
  cpu->kernels<Elem>().layernorm_backward(dx.first, dw.first, db.first, dout.first, x.first,
                                          w.first, mean.first, rstd.first, N, C);
  gpu->kernels<Elem>().layernorm_backward(dx.second, dw.second, db.second, dout.second, x.second,
                                          w.second, mean.second, rstd.second, N, C);
  t.expect_near(dx, N * C, rel, "layernorm_backward dinp");
  t.expect_near(dw, C, rel, "layernorm_backward dweight");
  t.expect_near(db, C, rel, "layernorm_backward dbias");
  // RMSNorm, its backward pass onto non-zero gradients.
  cpu->kernels<Elem>().rmsnorm_forward(out.first, rstd.first, x.first, w.first, 1e-5f, N, C);
  gpu->kernels<Elem>().rmsnorm_forward(out.second, rstd.second, x.second, w.second, 1e-5f, N, C);
  t.expect_near(out, N * C, rel, "rmsnorm_forward");
  t.expect_near(rstd, N, rel, "rmsnorm_forward rstd");
  const auto rms_dx = t.upload(data(N * C, 27)), rms_dw = t.upload(data(C, 28, 0.1f));
  cpu->kernels<Elem>().rmsnorm_backward(rms_dx.first, rms_dw.first, dout.first, x.first, w.first,
                                        rstd.first, N, C);
  gpu->kernels<Elem>().rmsnorm_backward(rms_dx.second, rms_dw.second, dout.second, x.second,
                                        w.second, rstd.second, N, C);
  t.expect_near(rms_dx, N * C, rel, "rmsnorm_backward dinp");
  t.expect_near(rms_dw, C, rel, "rmsnorm_backward dweight");
  // Head RMSNorm (Qwen3's q/k norms) on the NH query heads of a qkv [N, W] (head size C /
  // NH); its backward in place, as the model runs it.
  {
    const int HS = C / NH, W = (NH + 2 * s.KVH) * HS;
    const auto qkv_in = t.upload(data(N * W, 29)), qkv_out = t.upload(data(N * W, 30));
    const auto hw = t.upload(data(HS, 31, 0.5f));
    const auto head_rstd = t.floats(std::vector<float>(N * NH));
    cpu->kernels<Elem>().head_rmsnorm_forward(qkv_out.first, head_rstd.first, qkv_in.first,
                                              hw.first, 1e-6f, N, NH, HS, W);
    gpu->kernels<Elem>().head_rmsnorm_forward(qkv_out.second, head_rstd.second, qkv_in.second,
                                              hw.second, 1e-6f, N, NH, HS, W);
    t.expect_near(qkv_out, N * W, rel, "head_rmsnorm_forward");
    t.expect_near(head_rstd, N * NH, rel, "head_rmsnorm_forward rstd");
    const auto dqkv = t.upload(data(N * W, 32)), hdw = t.upload(data(HS, 33, 0.1f));
    cpu->kernels<Elem>().head_rmsnorm_backward(dqkv.first, hdw.first, dqkv.first, qkv_in.first,
                                               hw.first, head_rstd.first, N, NH, HS, W);
    gpu->kernels<Elem>().head_rmsnorm_backward(dqkv.second, hdw.second, dqkv.second, qkv_in.second,
                                               hw.second, head_rstd.second, N, NH, HS, W);
    t.expect_near(dqkv, N * W, rel, "head_rmsnorm_backward dinp (in place)");
    t.expect_near(hdw, HS, rel, "head_rmsnorm_backward dweight");
  }

  // RoPE on a qkv of NH query and KVH key/value heads (head size C / NH), in place.
  {
    const int HS = C / NH, W = (NH + 2 * s.KVH) * HS;
    std::vector<float> table;
    for (int pos = 0; pos < T; pos++) {
      for (int i = 0; i < HS / 2; i++) {
        const double angle = pos * std::pow(100.0, -2.0 * i / HS);
        table.push_back(static_cast<float>(std::cos(angle)));
        table.push_back(static_cast<float>(std::sin(angle)));
      }
    }
    const auto cos_sin = t.floats(table);
    const auto qkv = t.upload(data(N * W, 14));
    cpu->kernels<Elem>().rope_forward(qkv.first, cos_sin.first, B, T, NH, s.KVH, HS);
    gpu->kernels<Elem>().rope_forward(qkv.second, cos_sin.second, B, T, NH, s.KVH, HS);
    t.expect_near(qkv, N * W, rel, "rope_forward");
    const auto dqkv = t.upload(data(N * W, 15));
    cpu->kernels<Elem>().rope_backward(dqkv.first, cos_sin.first, B, T, NH, s.KVH, HS);
    gpu->kernels<Elem>().rope_backward(dqkv.second, cos_sin.second, B, T, NH, s.KVH, HS);
    t.expect_near(dqkv, N * W, rel, "rope_backward");
  }
  // SwiGLU with I = C: [gate | up] rows of 2C.
  {
    const auto gate_up = t.upload(data(N * 2 * C, 16, 2.0f)), dgate_up = t.upload(zeros(N * 2 * C));
    cpu->kernels<Elem>().swiglu_forward(out.first, gate_up.first, N, C);
    gpu->kernels<Elem>().swiglu_forward(out.second, gate_up.second, N, C);
    t.expect_near(out, N * C, rel, "swiglu_forward");
    cpu->kernels<Elem>().swiglu_backward(dgate_up.first, gate_up.first, dout.first, N, C);
    gpu->kernels<Elem>().swiglu_backward(dgate_up.second, gate_up.second, dout.second, N, C);
    t.expect_near(dgate_up, N * 2 * C, rel, "swiglu_backward");
  }

  const auto wm = t.upload(data(OC * C, 8, 0.2f)), bm = t.upload(data(OC, 9));
  const auto mo = t.upload(zeros(N * OC)), dmo = t.upload(data(N * OC, 10));
  cpu->kernels<Elem>().matmul_forward(mo.first, x.first, wm.first, bm.first, N, C, OC);
  gpu->kernels<Elem>().matmul_forward(mo.second, x.second, wm.second, bm.second, N, C, OC);
  t.expect_near(mo, N * OC, rel, "matmul_forward");
  cpu->kernels<Elem>().matmul_forward(mo.first, x.first, wm.first, nullptr, N, C, OC);
  gpu->kernels<Elem>().matmul_forward(mo.second, x.second, wm.second, nullptr, N, C, OC);
  t.expect_near(mo, N * OC, rel, "matmul_forward without bias");
  const auto dwm = t.upload(data(OC * C, 25, 0.1f)), dbm = t.upload(data(OC, 26, 0.1f));
  cpu->kernels<Elem>().matmul_backward(dx.first, dwm.first, dbm.first, dmo.first, x.first, wm.first,
                                       N, C, OC);
  gpu->kernels<Elem>().matmul_backward(dx.second, dwm.second, dbm.second, dmo.second, x.second,
                                       wm.second, N, C, OC);
  t.expect_near(dx, N * C, rel, "matmul_backward dinp");
  t.expect_near(dwm, OC * C, rel, "matmul_backward dweight");
  t.expect_near(dbm, OC, rel, "matmul_backward dbias");

  if (s.attention) {
    const auto qkv = t.upload(data(N * 3 * C, 11));
    const auto lse = t.floats(std::vector<float>(B * NH * T));
    cpu->kernels<Elem>().attention_forward(out.first, lse.first, qkv.first, B, T, NH, NH, C / NH);
    gpu->kernels<Elem>().attention_forward(out.second, lse.second, qkv.second, B, T, NH, NH,
                                           C / NH);
    t.expect_near(out, N * C, rel, "attention_forward");
    t.expect_near(lse, B * NH * T, rel, "attention_forward lse");
    const auto dqkv = t.upload(zeros(N * 3 * C));
    cpu->kernels<Elem>().attention_backward(dqkv.first, dout.first, qkv.first, out.first, lse.first,
                                            B, T, NH, NH, C / NH);
    gpu->kernels<Elem>().attention_backward(dqkv.second, dout.second, qkv.second, out.second,
                                            lse.second, B, T, NH, NH, C / NH);
    t.expect_near(dqkv, N * 3 * C, attention_rel, "attention_backward");

    // Grouped-query: NH query heads share KVH key/value heads.
    const int HS = C / NH, W = (NH + 2 * s.KVH) * HS;
    const auto gqa = t.upload(data(N * W, 17));
    cpu->kernels<Elem>().attention_forward(out.first, lse.first, gqa.first, B, T, NH, s.KVH, HS);
    gpu->kernels<Elem>().attention_forward(out.second, lse.second, gqa.second, B, T, NH, s.KVH, HS);
    t.expect_near(out, N * C, rel, "attention_forward, grouped-query");
    t.expect_near(lse, B * NH * T, rel, "attention_forward lse, grouped-query");
    const auto dgqa = t.upload(zeros(N * W));
    cpu->kernels<Elem>().attention_backward(dgqa.first, dout.first, gqa.first, out.first, lse.first,
                                            B, T, NH, s.KVH, HS);
    gpu->kernels<Elem>().attention_backward(dgqa.second, dout.second, gqa.second, out.second,
                                            lse.second, B, T, NH, s.KVH, HS);
    t.expect_near(dgqa, N * W, attention_rel, "attention_backward, grouped-query");
  }

  cpu->kernels<Elem>().gelu_forward(out.first, x.first, N * C);
  gpu->kernels<Elem>().gelu_forward(out.second, x.second, N * C);
  t.expect_near(out, N * C, rel, "gelu_forward");
  cpu->kernels<Elem>().gelu_forward(out.first + 1, x.first + 1, N * C - 1);
  gpu->kernels<Elem>().gelu_forward(out.second + 1, x.second + 1, N * C - 1);
  t.expect_near(out, N * C, rel, "gelu_forward, unaligned");
  cpu->kernels<Elem>().gelu_backward(out2.first, x.first, dout.first, N * C);
  gpu->kernels<Elem>().gelu_backward(out2.second, x.second, dout.second, N * C);
  t.expect_near(out2, N * C, rel, "gelu_backward");
  cpu->kernels<Elem>().residual_forward(out.first, x.first, dout.first, N * C);
  gpu->kernels<Elem>().residual_forward(out.second, x.second, dout.second, N * C);
  t.expect_near(out, N * C, 0, "residual_forward");
  cpu->kernels<Elem>().residual_forward(out.first + 1, x.first + 1, dout.first + 1, N * C - 1);
  gpu->kernels<Elem>().residual_forward(out.second + 1, x.second + 1, dout.second + 1, N * C - 1);
  t.expect_near(out, N * C, 0, "residual_forward, unaligned");

  const auto logits = t.upload(data(N * V, 12, 3.0f));
  const auto losses = t.floats(std::vector<float>(N));
  const auto dlogits = t.upload(zeros(N * V));
  cpu->kernels<Elem>().cross_entropy_forward(losses.first, logits.first, tgt.first, N, V);
  gpu->kernels<Elem>().cross_entropy_forward(losses.second, logits.second, tgt.second, N, V);
  t.expect_near(losses, N, rel, "cross_entropy_forward");
  {
    float ignored_loss = -1.0f;
    gpu->copy_to_host(&ignored_loss, losses.second + 1, sizeof(float));
    EXPECT_EQ(ignored_loss, 0.0f) << "the ignored target's loss";
  }
  cpu->kernels<Elem>().cross_entropy_backward(dlogits.first, logits.first, tgt.first, 0.25f, N, V);
  gpu->kernels<Elem>().cross_entropy_backward(dlogits.second, logits.second, tgt.second, 0.25f, N,
                                              V);
  t.expect_near(dlogits, N * V, rel, "cross_entropy_backward");

  const size_t n = 100000;
  const auto sq = t.upload(data(n, 13));
  for (const size_t offset : {size_t{0}, size_t{1}}) {
    const double want = cpu->kernels<Elem>().sum_of_squares(sq.first + offset, n - offset);
    EXPECT_NEAR(want, gpu->kernels<Elem>().sum_of_squares(sq.second + offset, n - offset),
                1e-9 * want)
        << "offset " << offset;
  }
}

TEST(CudaBackend, BlockSumsOfSquaresComposeToTheSumAndToAPartitionsOwn) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend();
  testing::check_block_sums<float>(*gpu);
  testing::check_block_sums<Bf16>(*gpu);
}

TEST(CudaBackend, EveryKernelMatchesItsCpuCounterpart) {
  SKIP_WITHOUT_GPU();
  expect_every_kernel_matches<float>({2, 9, 32, 4, 2, 50, 24, true}, 2e-5, 1e-4);
  expect_every_kernel_matches<float>({2, 7, 30, 5, 1, 37, 21, false}, 2e-5, 1e-4);
}

// Byte data: one token (the space) at 80% of B*T = 8192 positions, the case the GPU's
// pieces exist for (a run of ~6500 positions summed by ~200 blocks, then added in order).
// dwte is a fixed sequence of fp32 additions on both backends (embedding_backward_order.h;
// no products, so fused multiply-adds cannot change it): the same bits, fp32 and bf16,
// on the 16-byte path (C = 768: several column passes per block) and the scalar one
// (C = 30). dwpe sums over the batch in order on both, compared within rel.
template <typename Elem>
void expect_long_run_matches(int C, double rel) {
  SCOPED_TRACE(::testing::Message() << (sizeof(Elem) == 2 ? "bf16" : "fp32") << " C " << C);
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  Twin t{*cpu, *gpu, {}};
  const int B = 4, T = 2048, V = 256, BT = B * T, kSpace = 32;
  Rng rng(77);
  std::vector<int32_t> tokens(BT);
  for (int& token : tokens)
    token = rng.next_u64() % 5 != 0 ? kSpace : static_cast<int32_t>(rng.next_u64() % V);
  ASSERT_GT(std::count(tokens.begin(), tokens.end(), kSpace), 6000);
  const auto tok = t.ints(tokens);
  const auto dout = t.upload(stored<Elem>(randn(static_cast<size_t>(BT) * C, 41)));
  const auto dwte = t.upload(stored<Elem>(randn(static_cast<size_t>(V) * C, 42, 0.1f)));
  const auto dwpe = t.upload(stored<Elem>(randn(static_cast<size_t>(T) * C, 43, 0.1f)));
  cpu->kernels<Elem>().encoder_backward(dwte.first, dwpe.first, dout.first, tok.first, B, T, C);
  gpu->kernels<Elem>().encoder_backward(dwte.second, dwpe.second, dout.second, tok.second, B, T, C);
  std::vector<Elem> want(static_cast<size_t>(V) * C), got(want.size());
  cpu->copy_to_host(want.data(), dwte.first, want.size() * sizeof(Elem));
  gpu->copy_to_host(got.data(), dwte.second, got.size() * sizeof(Elem));
  for (size_t i = 0; i < want.size(); i++)
    ASSERT_EQ(to_float(want[i]), to_float(got[i])) << "dwte[" << i << "]";
  t.expect_near(dwpe, static_cast<size_t>(T) * C, rel, "encoder_backward dwpe");
}

TEST(CudaBackend, EncoderBackwardSpreadsALongRunOfOneTokenLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_long_run_matches<float>(768, 2e-5);
  expect_long_run_matches<float>(30, 2e-5);
  expect_long_run_matches<Bf16>(768, 2e-2);
  expect_long_run_matches<Bf16>(30, 2e-2);
}

// Bf16 storage: the GPU against the CPU backend's Bf16 kernels (which widen to fp32 and
// round once on store, as the GPU kernels do), so the two differ only by fp32 arithmetic
// order, now and then turning into one bf16 ulp (2^-8 relative).
TEST(CudaBackend, EveryBf16KernelMatchesTheCpuBf16Kernels) {
  SKIP_WITHOUT_GPU();
  expect_every_kernel_matches<Bf16>({2, 9, 64, 4, 2, 50, 24, true}, 2e-2, 2e-2);
  expect_every_kernel_matches<Bf16>({2, 7, 30, 5, 1, 37, 21, false}, 2e-2, 2e-2);
}

// The bf16 matmuls are the fp32 ones rounded once (twice at most for the accumulating
// dweight and dbias: the sum, then the old value added): products summed in fp32 (in bf16
// the error over K = 256 terms would be many ulps). Inputs are exact in bf16, so both runs see
// the same numbers. The second shape has leading dimensions that are not multiples of
// 16 bytes, and its bias sits one element into a buffer: no bias epilogue then.
TEST(CudaBackend, Bf16MatmulIsTheFp32MatmulRoundedToBf16) {
  SKIP_WITHOUT_GPU();
  auto gpu = make_cuda_backend();
  struct Shape {
    int N, C, OC, bias_offset;
  };
  for (const Shape& shape : {Shape{64, 256, 96, 0}, Shape{33, 70, 50, 1}}) {
    const int N = shape.N, C = shape.C, OC = shape.OC;
    SCOPED_TRACE(::testing::Message() << "N " << N << " C " << C << " OC " << OC);
    const auto exact = [](size_t n, uint64_t seed, float scale) {
      std::vector<float> v = randn(n, seed, scale);
      for (float& x : v) x = to_float(from_float<Bf16>(x));
      return v;
    };
    const std::vector<float> x = exact(N * C, 1, 1.0f), w = exact(OC * C, 2, 0.1f);
    const std::vector<float> bias = exact(OC + 1, 3, 1.0f), dout = exact(N * OC, 4, 1.0f);
    const std::vector<float> dw0 = exact(OC * C, 5, 1.0f), db0 = exact(OC, 6, 1.0f);

    std::vector<Buffer> keep;
    const auto put = [&](const auto& host) {
      using T = typename std::decay_t<decltype(host)>::value_type;
      keep.push_back(gpu->allocate(host.size() * sizeof(T)));
      gpu->copy_from_host(keep.back().as<void>(), host.data(), host.size() * sizeof(T));
      return keep.back().as<T>();
    };
    const auto get = [&](const auto* device, size_t n) {
      using T = std::decay_t<decltype(*device)>;
      std::vector<T> host(n);
      gpu->copy_to_host(host.data(), device, n * sizeof(T));
      std::vector<float> out(n);
      for (size_t i = 0; i < n; i++) out[i] = to_float(host[i]);
      return out;
    };

    // fp32
    float* x32 = put(x);
    float* w32 = put(w);
    float* b32 = put(bias);
    float* d32 = put(dout);
    float* dw32 = put(dw0);
    float* db32 = put(db0);
    float* out32 = put(std::vector<float>(N * OC));
    float* din32 = put(std::vector<float>(N * C));
    gpu->kernels<float>().matmul_forward(out32, x32, w32, b32 + shape.bias_offset, N, C, OC);
    gpu->kernels<float>().matmul_backward(din32, dw32, db32, d32, x32, w32, N, C, OC);
    // bf16
    Bf16* x16 = put(stored<Bf16>(x));
    Bf16* w16 = put(stored<Bf16>(w));
    Bf16* b16 = put(stored<Bf16>(bias));
    Bf16* d16 = put(stored<Bf16>(dout));
    Bf16* dw16 = put(stored<Bf16>(dw0));
    Bf16* db16 = put(stored<Bf16>(db0));
    Bf16* out16 = put(std::vector<Bf16>(N * OC));
    Bf16* din16 = put(std::vector<Bf16>(N * C));
    gpu->kernels<Bf16>().matmul_forward(out16, x16, w16, b16 + shape.bias_offset, N, C, OC);
    gpu->kernels<Bf16>().matmul_backward(din16, dw16, db16, d16, x16, w16, N, C, OC);

    // Within half a bf16 ulp of the fp32 value (<= 2^-8 relative), plus a little for the
    // two GEMMs' different fp32 summation orders. An accumulated output (old value `before`
    // plus the new sum) may be rounded twice: the H100's cuBLASLt rounds the product to bf16
    // before adding C (measured: dweight one ulp off the once-rounded value), as PyTorch's
    // bf16 gradient accumulation does, so it gets half an ulp of the product on top.
    const auto expect_rounded = [](const std::vector<float>& fp32, const std::vector<float>& bf16,
                                   const char* what, const std::vector<float>* before = nullptr) {
      double scale = 0;
      for (float v : fp32) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      for (size_t i = 0; i < fp32.size(); i++) {
        double tolerance = std::ldexp(std::fabs(fp32[i]), -8) + 1e-5 * scale;
        if (before != nullptr) tolerance += std::ldexp(std::fabs(fp32[i] - (*before)[i]), -8);
        ASSERT_NEAR(bf16[i], fp32[i], tolerance) << what << "[" << i << "]";
      }
    };
    expect_rounded(get(out32, N * OC), get(out16, N * OC), "matmul_forward");
    expect_rounded(get(din32, N * C), get(din16, N * C), "matmul_backward dinp");
    expect_rounded(get(dw32, OC * C), get(dw16, OC * C), "matmul_backward dweight", &dw0);
    expect_rounded(get(db32, OC), get(db16, OC), "matmul_backward dbias", &db0);
  }
}

// Flash attention over several query and key tiles (T not a multiple of any tile size,
// head sizes of the tensor-core path), GPU against the CPU's attention: small enough for
// compute-sanitizer (bench/gpu_goals.sh runs racecheck and memcheck on it).
template <typename Elem>
void expect_flash_attention_matches(int B, int T, int NH, int hs, double rel) {
  SCOPED_TRACE(::testing::Message() << "B " << B << " T " << T << " NH " << NH << " hs " << hs
                                    << (sizeof(Elem) == 2 ? " bf16" : " fp32"));
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  Twin t{*cpu, *gpu, {}};
  const int C = NH * hs, N = B * T;
  const auto qkv = t.upload(stored<Elem>(randn(static_cast<size_t>(N) * 3 * C, 31)));
  const auto dout = t.upload(stored<Elem>(randn(static_cast<size_t>(N) * C, 32)));
  const auto out = t.upload(std::vector<Elem>(static_cast<size_t>(N) * C));
  const auto lse = t.floats(std::vector<float>(static_cast<size_t>(B) * NH * T));
  cpu->kernels<Elem>().attention_forward(out.first, lse.first, qkv.first, B, T, NH, NH, C / NH);
  gpu->kernels<Elem>().attention_forward(out.second, lse.second, qkv.second, B, T, NH, NH, C / NH);
  t.expect_near(out, static_cast<size_t>(N) * C, rel, "attention_forward");
  t.expect_near(lse, static_cast<size_t>(B) * NH * T, rel, "attention_forward lse");
  // Both backward passes from the GPU's forward output and lse, so they differ only by
  // the backward itself.
  std::vector<Elem> gpu_out(static_cast<size_t>(N) * C);
  std::vector<float> gpu_lse(static_cast<size_t>(B) * NH * T);
  gpu->copy_to_host(gpu_out.data(), out.second, gpu_out.size() * sizeof(Elem));
  gpu->copy_to_host(gpu_lse.data(), lse.second, gpu_lse.size() * sizeof(float));
  cpu->copy_from_host(out.first, gpu_out.data(), gpu_out.size() * sizeof(Elem));
  cpu->copy_from_host(lse.first, gpu_lse.data(), gpu_lse.size() * sizeof(float));
  const auto dqkv = t.upload(std::vector<Elem>(static_cast<size_t>(N) * 3 * C));
  cpu->kernels<Elem>().attention_backward(dqkv.first, dout.first, qkv.first, out.first, lse.first,
                                          B, T, NH, NH, C / NH);
  gpu->kernels<Elem>().attention_backward(dqkv.second, dout.second, qkv.second, out.second,
                                          lse.second, B, T, NH, NH, C / NH);
  t.expect_near(dqkv, static_cast<size_t>(N) * 3 * C, rel, "attention_backward");
}

TEST(CudaBackend, FlashAttentionMatchesTheCpuAcrossTiles) {
  SKIP_WITHOUT_GPU();
  expect_flash_attention_matches<float>(2, 130, 2, 64, 1e-4);
  expect_flash_attention_matches<float>(1, 77, 1, 128, 1e-4);
  expect_flash_attention_matches<Bf16>(2, 130, 2, 64, 3e-2);
  expect_flash_attention_matches<Bf16>(1, 77, 1, 128, 3e-2);
  expect_flash_attention_matches<Bf16>(1, 33, 3, 32, 3e-2);
}

// One model on each backend, the GPU's with the CPU's weights: loss within loss_rel, every
// gradient within grad_rel of its tensor's largest one.
void expect_same_loss_and_gradients(Model& a, Model& b, StorageDType dtype, double loss_rel,
                                    double grad_rel) {
  b.set_params(a.params_to_host());  // exact: already rounded to dtype
  const int B = a.max_batch(), T = a.max_seq_len(), V = a.config().vocab_size;
  Rng rng(9);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % V);
    targets[i] = static_cast<int32_t>(rng.next_u64() % V);
  }
  a.zero_grads();
  b.zero_grads();
  const float la = a.forward(tokens.data(), targets.data(), B, T);
  const float lb = b.forward(tokens.data(), targets.data(), B, T);
  EXPECT_NEAR(la, lb, loss_rel * la) << storage_dtype_name(dtype);
  a.backward();
  b.backward();
  const auto ga = a.grads_to_host(), gb = b.grads_to_host();
  for (const ParamView& view : a.layout().views()) {
    double scale = 0;
    for (size_t i = 0; i < view.numel; i++)
      scale = std::max(scale, std::fabs(static_cast<double>(ga[view.offset + i])));
    ASSERT_GT(scale, 0.0) << view.name << ": no gradient to compare";
    for (size_t i = 0; i < view.numel; i++)
      ASSERT_NEAR(ga[view.offset + i], gb[view.offset + i], grad_rel * scale + 1e-7)
          << storage_dtype_name(dtype) << " " << view.name << "[" << i << "]";
  }
}

// The tiny GPT-2 on both backends from the same weights.
void expect_tiny_model_matches(StorageDType dtype, double loss_rel, double grad_rel) {
  const ModelConfig config{
      .vocab_size = 64, .context_length = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  Gpt a(config, *cpu, 2, 16, dtype), b(config, *gpu, 2, 16, dtype);
  a.init_weights(5);
  expect_same_loss_and_gradients(a, b, dtype, loss_rel, grad_rel);
}

TEST(CudaBackend, TinyModelLogitsLossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_tiny_model_matches(StorageDType::kF32, 1e-5, 1e-4);
}

// bf16 on both sides (the CPU rounds each stored result once, like the GPU), so only
// the fp32 summation order and the GPU attention's bf16 probabilities differ.
TEST(CudaBackend, TinyBf16ModelLossAndGradientsMatchTheCpuWithinBf16Accuracy) {
  SKIP_WITHOUT_GPU();
  expect_tiny_model_matches(StorageDType::kBF16, 1e-2, 5e-2);
}

// A tiny Llama (grouped-query heads: 4 query, 2 key/value, head size 8; RMSNorm, RoPE,
// SwiGLU; an LM head of its own) on both backends, from random weights (norm weights away
// from 1, so that every term of RMSNorm's backward counts).
// `options` sets the Llama family's options on top (model_config.h).
void expect_tiny_llama_matches(StorageDType dtype, double loss_rel, double grad_rel,
                               const std::function<void(ModelConfig&)>& options = {}) {
  ModelConfig config;
  config.type = ModelType::kLlama;
  config.vocab_size = 64;
  config.context_length = 16;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_kv_head = 2;
  config.n_embd = 32;
  config.intermediate_size = 40;
  config.rope_theta = 100.0;  // large angles over 16 positions
  config.tie_word_embeddings = false;
  if (options) options(config);
  config.validate();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  Llama a(config, *cpu, 2, 16, dtype), b(config, *gpu, 2, 16, dtype);
  Rng rng(13);
  std::vector<float> params(a.layout().num_elements());
  for (const ParamView& view : a.layout().views())
    for (size_t i = 0; i < view.numel; i++)
      params[view.offset + i] = (view.shape.size() == 1 ? 1.0f : 0.0f) + 0.2f * rng.normal();
  a.set_params(params);
  expect_same_loss_and_gradients(a, b, dtype, loss_rel, grad_rel);
}

TEST(CudaBackend, TinyLlamaLossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_tiny_llama_matches(StorageDType::kF32, 1e-5, 1e-4);
}

TEST(CudaBackend, TinyBf16LlamaLossAndGradientsMatchTheCpuWithinBf16Accuracy) {
  SKIP_WITHOUT_GPU();
  expect_tiny_llama_matches(StorageDType::kBF16, 1e-2, 5e-2);
}

// The Llama family's types on both backends: Qwen2's q, k, v biases; Qwen3's q/k norms
// (head_rmsnorm) with heads wider than C / NH and biases on q, k, v and o; Mistral's
// narrower heads; Llama 3's scaled rotation (a host-made table both backends read).
TEST(CudaBackend, TheLlamaFamilysTypesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::pair<const char*, std::function<void(ModelConfig&)>> types[] = {
      {"qwen2",
       [](ModelConfig& c) {
         c.type = ModelType::kQwen2;
         c.qkv_bias = true;
       }},
      {"qwen3",
       [](ModelConfig& c) {
         c.type = ModelType::kQwen3;
         c.head_dim = 16;
         c.qk_norm = c.qkv_bias = c.o_bias = true;
         c.tie_word_embeddings = true;
       }},
      {"mistral",
       [](ModelConfig& c) {
         c.type = ModelType::kMistral;
         c.head_dim = 4;
       }},
      {"llama3", [](ModelConfig& c) {
         c.rope_scaling = {.type = RopeType::kLlama3,
                           .factor = 8.0,
                           .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0,
                           .original_max_position_embeddings = 16};
       }}};
  for (const auto& [name, options] : types) {
    SCOPED_TRACE(name);
    expect_tiny_llama_matches(StorageDType::kF32, 1e-5, 1e-4, options);
    expect_tiny_llama_matches(StorageDType::kBF16, 1e-2, 5e-2, options);
  }
}

// Activation recompute on the GPU (ModelOwnBuffers::recompute_interval): its kernels are
// deterministic, so recomputing a segment's activations in backward gives the loss and every
// gradient of keeping them, bit for bit, for both families and storage types.
void expect_recompute_keeps_the_bits(ModelType type, StorageDType dtype) {
  SCOPED_TRACE(cat(model_type_name(type), " ", storage_dtype_name(dtype)));
  ModelConfig config;
  config.type = type;
  config.vocab_size = 64;
  config.context_length = 16;
  config.n_layer = 3;
  config.n_head = 4;
  config.n_embd = 32;
  if (type == ModelType::kLlama) {
    config.n_kv_head = 2;
    config.intermediate_size = 40;
    config.tie_word_embeddings = false;
  }
  auto gpu = make_cuda_backend();
  const int B = 2, T = 16;
  Rng rng(21);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % config.vocab_size);
    targets[i] = static_cast<int32_t>(rng.next_u64() % config.vocab_size);
  }
  const auto pass = [&](int interval, bool kept_on_host) {
    const std::unique_ptr<Model> model =
        make_model(config, *gpu, B, T, dtype,
                   {.recompute_interval = interval, .recompute_kept_on_host = kept_on_host});
    model->init_weights(3);
    model->zero_grads();
    const float loss = model->forward(tokens.data(), targets.data(), B, T);
    model->backward();
    return std::make_pair(loss, model->grads_to_host());
  };
  const auto kept = pass(0, false);
  // cpu_checkpointing at interval 1: three segments, the first one's output fetched back.
  for (const auto& [interval, on_host] :
       {std::pair{1, false}, std::pair{2, false}, std::pair{1, true}, std::pair{2, true}}) {
    SCOPED_TRACE(cat("interval ", interval, on_host ? ", kept on the host" : ""));
    const auto recomputed = pass(interval, on_host);
    EXPECT_EQ(std::memcmp(&recomputed.first, &kept.first, sizeof(float)), 0);
    ASSERT_EQ(recomputed.second.size(), kept.second.size());
    EXPECT_EQ(std::memcmp(recomputed.second.data(), kept.second.data(),
                          kept.second.size() * sizeof(float)),
              0);
  }
}

TEST(CudaBackend, RecomputeGivesTheBitsOfKeepingEveryLayer) {
  SKIP_WITHOUT_GPU();
  for (ModelType type : {ModelType::kGpt2, ModelType::kLlama})
    for (StorageDType dtype : {StorageDType::kF32, StorageDType::kBF16})
      expect_recompute_keeps_the_bits(type, dtype);
}

std::vector<double> losses_of(const std::filesystem::path& metrics) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto record = nlohmann::json::parse(line);
    if (record.contains("loss")) losses.push_back(record["loss"].get<double>());
  }
  return losses;
}

// 50 steps on the bundled data on the CPU and on the GPU, in fp32 or bf16 on both.
void expect_fifty_steps_match(bool bf16, double rel) {
  testing::ScratchDir dir(bf16 ? "cuda_training_bf16" : "cuda_training");
  TrainOptions options;
  options.show_progress = false;
  std::vector<std::vector<double>> runs;
  for (const char* type : {"cpu", "cuda"}) {
    nlohmann::json json = testing::tiny_run_config(
        testing::source_dir() / "data" / "tinyshakespeare.txt", dir / type);
    json["train"]["steps"] = 50;
    json["device"] = {{"type", type}};
    json["bf16"] = {{"enabled", bf16}};
    options.metrics_path = dir / (std::string(type) + ".jsonl");
    train(parse_train_config(json), options);
    runs.push_back(losses_of(options.metrics_path));
  }
  ASSERT_EQ(runs[0].size(), 50u);
  ASSERT_EQ(runs[1].size(), 50u);
  for (size_t i = 0; i < 50; i++)
    EXPECT_NEAR(runs[0][i], runs[1][i], rel * runs[0][i]) << "step " << i + 1;
}

TEST(CudaBackend, FiftyTrainingStepsMatchTheCpuRun) {
  SKIP_WITHOUT_GPU();
  expect_fifty_steps_match(false, 2e-3);
}

TEST(CudaBackend, FiftyBf16TrainingStepsMatchTheCpuBf16Run) {
  SKIP_WITHOUT_GPU();
  expect_fifty_steps_match(true, 3e-2);
}

// Every schedule gives the same optimizer state on the GPU, fp32 or bf16 model.
void expect_every_schedule_identical_on_the_gpu(bool bf16) {
  testing::ScratchDir dir(bf16 ? "cuda_schedules_bf16" : "cuda_schedules");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions quiet;
  quiet.show_progress = false;
  std::string first;
  int i = 0;
  for (const char* schedule : {"device", "cpu", "ratio", "interleave", "auto"}) {
    nlohmann::json json =
        testing::tiny_run_config(dir / "data.txt", dir / ("run" + std::to_string(i++)));
    json["train"]["steps"] = 6;
    json["gradient_clipping"] = 0.05;
    json["device"] = {{"type", "cuda"}};
    json["bf16"] = {{"enabled", bf16}};
    json["zero_optimization"] = {{"sub_group_size", 1000}};
    json["offload_optimizer"] = {{"schedule", schedule}};
    const TrainResult result = train(parse_train_config(json), quiet);
    if (first.empty()) first = result.state_digest;
    EXPECT_EQ(result.state_digest, first) << schedule << (bf16 ? " (bf16)" : " (fp32)");
  }
}

TEST(CudaBackend, EveryScheduleTrainsToTheSameBitsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  expect_every_schedule_identical_on_the_gpu(false);
  expect_every_schedule_identical_on_the_gpu(true);
}

// Lazy checkpoints on the GPU: the snapshot is copied from device-resident, staged and
// host subgroups into pinned memory on a stream of its own while the next step runs, and
// holds the bytes a synchronous checkpoint writes; so does one streamed through a bounded
// pool of pinned slots (train.checkpoint_memory_mb below the state's 124 KB), whose copies
// a thread of the engine's queues as the writer frees slots.
TEST(CudaBackend, LazyCheckpointsHoldTheSynchronousBitsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  testing::ScratchDir dir("cuda_lazy_checkpoints");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions quiet;
  quiet.show_progress = false;
  struct Mode {
    const char* name;
    bool lazy;
    double memory_mb;  // 0: a full copy
  };
  const Mode modes[] = {{"sync", false, 0}, {"lazy", true, 0}, {"streamed", true, 0.07}};
  // interleave: staged and host subgroups.
  for (const char* schedule : {"device", "interleave"}) {
    std::vector<TrainResult> results;
    for (const Mode& mode : modes) {
      nlohmann::json json = testing::tiny_run_config(
          dir / "data.txt", dir / (std::string(schedule) + "_" + mode.name));
      json["train"]["steps"] = 3;
      json["train"]["eval_interval"] = 0;
      json["train"]["checkpoint_interval"] = 2;
      json["train"]["lazy_checkpoints"] = mode.lazy;
      if (mode.memory_mb > 0) json["train"]["checkpoint_memory_mb"] = mode.memory_mb;
      json["device"] = {{"type", "cuda"}};
      json["zero_optimization"] = {{"sub_group_size", 1000}};
      json["offload_optimizer"] = {{"schedule", schedule}};
      const TrainConfig config = parse_train_config(json);
      if (mode.memory_mb > 0) {
        auto device = make_training_device(config);
        ThreadPool pool(1);
        ASSERT_TRUE(plan_training(config, *device, pool).snapshot.streamed) << schedule;
      }
      results.push_back(train(config, quiet));
    }
    const TrainResult& sync = results[0];
    for (size_t m = 1; m < results.size(); m++) {
      const std::string what = cat(schedule, " ", modes[m].name);
      ASSERT_EQ(results[m].checkpoints.size(), 2u) << what;  // step 2 lazy, 3 synchronous
      EXPECT_EQ(results[m].state_digest, sync.state_digest) << what;
      for (size_t k = 0; k < 2; k++) {
        EXPECT_EQ(results[m].checkpoints[k].lazy, k == 0) << what;
        for (const char* file : {"model.safetensors", "optimizer.safetensors"})
          EXPECT_EQ(read_file_bytes(results[m].checkpoints[k].path / file),
                    read_file_bytes(sync.checkpoints[k].path / file))
              << what << " checkpoint " << k << ": " << file;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
