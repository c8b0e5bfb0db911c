// The CUDA compute backend against the CPU one (skipped, with the reason, where there is
// no GPU): every kernel on random data, a tiny model's logits, loss and gradients, 50
// training steps on the bundled data, and every update schedule bit-identical on the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/core/file_io.h"
#include "tandem/core/rng.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/model/gpt.h"
#include "tandem/train/trainer.h"
#include "test_util.h"

namespace tandem {
namespace {

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

  std::pair<float*, float*> floats(const std::vector<float>& host) {
    keep.push_back(cpu.allocate(host.size() * 4));
    float* a = keep.back().as<float>();
    keep.push_back(gpu.allocate(host.size() * 4));
    float* b = keep.back().as<float>();
    cpu.copy_from_host(a, host.data(), host.size() * 4);
    gpu.copy_from_host(b, host.data(), host.size() * 4);
    return {a, b};
  }
  std::pair<int32_t*, int32_t*> ints(const std::vector<int32_t>& host) {
    keep.push_back(cpu.allocate(host.size() * 4));
    auto* a = keep.back().as<int32_t>();
    keep.push_back(gpu.allocate(host.size() * 4));
    auto* b = keep.back().as<int32_t>();
    cpu.copy_from_host(a, host.data(), host.size() * 4);
    gpu.copy_from_host(b, host.data(), host.size() * 4);
    return {a, b};
  }
  // Expects the two results to agree within rel * max|cpu| + 1e-6.
  void expect_near(std::pair<float*, float*> x, size_t n, double rel, const char* what) {
    std::vector<float> a(n), b(n);
    cpu.copy_to_host(a.data(), x.first, n * 4);
    gpu.copy_to_host(b.data(), x.second, n * 4);
    double scale = 0;
    for (float v : a) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    for (size_t i = 0; i < n; i++)
      ASSERT_NEAR(a[i], b[i], rel * scale + 1e-6) << what << "[" << i << "]";
  }
};

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

TEST(CudaBackend, EveryKernelMatchesItsCpuCounterpart) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  Twin t{*cpu, *gpu, {}};
  const int B = 2, T = 9, C = 32, NH = 4, V = 50, OC = 24, N = B * T;
  const double rel = 2e-5;
  Rng rng(1);
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % V);
    targets[i] = static_cast<int32_t>(rng.next_u64() % V);
  }
  const auto tok = t.ints(tokens), tgt = t.ints(targets);
  const auto wte = t.floats(randn(V * C, 2)), wpe = t.floats(randn(T * C, 3));
  const auto x = t.floats(randn(N * C, 4)), dout = t.floats(randn(N * C, 5));
  const auto out = t.floats(std::vector<float>(N * C)), out2 = t.floats(std::vector<float>(N * C));

  cpu->encoder_forward(out.first, tok.first, wte.first, wpe.first, B, T, C);
  gpu->encoder_forward(out.second, tok.second, wte.second, wpe.second, B, T, C);
  t.expect_near(out, N * C, rel, "encoder_forward");
  const auto dwte = t.floats(std::vector<float>(V * C)), dwpe = t.floats(std::vector<float>(T * C));
  cpu->encoder_backward(dwte.first, dwpe.first, dout.first, tok.first, B, T, C);
  gpu->encoder_backward(dwte.second, dwpe.second, dout.second, tok.second, B, T, C);
  t.expect_near(dwte, V * C, rel, "encoder_backward dwte");
  t.expect_near(dwpe, T * C, rel, "encoder_backward dwpe");

  const auto w = t.floats(randn(C, 6, 0.5f)), b = t.floats(randn(C, 7, 0.5f));
  const auto mean = t.floats(std::vector<float>(N)), rstd = t.floats(std::vector<float>(N));
  cpu->layernorm_forward(out.first, mean.first, rstd.first, x.first, w.first, b.first, N, C);
  gpu->layernorm_forward(out.second, mean.second, rstd.second, x.second, w.second, b.second, N, C);
  t.expect_near(out, N * C, rel, "layernorm_forward");
  const auto dx = t.floats(std::vector<float>(N * C));
  const auto dw = t.floats(std::vector<float>(C)), db = t.floats(std::vector<float>(C));
  cpu->layernorm_backward(dx.first, dw.first, db.first, dout.first, x.first, w.first, mean.first,
                          rstd.first, N, C);
  gpu->layernorm_backward(dx.second, dw.second, db.second, dout.second, x.second, w.second,
                          mean.second, rstd.second, N, C);
  t.expect_near(dx, N * C, rel, "layernorm_backward dinp");
  t.expect_near(dw, C, rel, "layernorm_backward dweight");
  t.expect_near(db, C, rel, "layernorm_backward dbias");

  const auto wm = t.floats(randn(OC * C, 8, 0.2f)), bm = t.floats(randn(OC, 9));
  const auto mo = t.floats(std::vector<float>(N * OC)), dmo = t.floats(randn(N * OC, 10));
  cpu->matmul_forward(mo.first, x.first, wm.first, bm.first, N, C, OC);
  gpu->matmul_forward(mo.second, x.second, wm.second, bm.second, N, C, OC);
  t.expect_near(mo, N * OC, rel, "matmul_forward");
  const auto dwm = t.floats(std::vector<float>(OC * C)), dbm = t.floats(std::vector<float>(OC));
  cpu->matmul_backward(dx.first, dwm.first, dbm.first, dmo.first, x.first, wm.first, N, C, OC);
  gpu->matmul_backward(dx.second, dwm.second, dbm.second, dmo.second, x.second, wm.second, N, C,
                       OC);
  t.expect_near(dx, N * C, rel, "matmul_backward dinp");
  t.expect_near(dwm, OC * C, rel, "matmul_backward dweight");
  t.expect_near(dbm, OC, rel, "matmul_backward dbias");

  const auto qkv = t.floats(randn(N * 3 * C, 11));
  const auto lse = t.floats(std::vector<float>(B * NH * T));
  cpu->attention_forward(out.first, lse.first, qkv.first, B, T, C, NH);
  gpu->attention_forward(out.second, lse.second, qkv.second, B, T, C, NH);
  t.expect_near(out, N * C, rel, "attention_forward");
  t.expect_near(lse, B * NH * T, rel, "attention_forward lse");
  const auto dqkv = t.floats(std::vector<float>(N * 3 * C));
  cpu->attention_backward(dqkv.first, dout.first, qkv.first, out.first, lse.first, B, T, C, NH);
  gpu->attention_backward(dqkv.second, dout.second, qkv.second, out.second, lse.second, B, T, C,
                          NH);
  t.expect_near(dqkv, N * 3 * C, 1e-4, "attention_backward");

  cpu->gelu_forward(out.first, x.first, N * C);
  gpu->gelu_forward(out.second, x.second, N * C);
  t.expect_near(out, N * C, rel, "gelu_forward");
  cpu->gelu_backward(out2.first, x.first, dout.first, N * C);
  gpu->gelu_backward(out2.second, x.second, dout.second, N * C);
  t.expect_near(out2, N * C, rel, "gelu_backward");
  cpu->residual_forward(out.first, x.first, dout.first, N * C);
  gpu->residual_forward(out.second, x.second, dout.second, N * C);
  t.expect_near(out, N * C, 0, "residual_forward");

  const auto logits = t.floats(randn(N * V, 12, 3.0f));
  const auto losses = t.floats(std::vector<float>(N)),
             dlogits = t.floats(std::vector<float>(N * V));
  cpu->cross_entropy_forward(losses.first, logits.first, tgt.first, N, V);
  gpu->cross_entropy_forward(losses.second, logits.second, tgt.second, N, V);
  t.expect_near(losses, N, rel, "cross_entropy_forward");
  cpu->cross_entropy_backward(dlogits.first, logits.first, tgt.first, 0.25f, N, V);
  gpu->cross_entropy_backward(dlogits.second, logits.second, tgt.second, 0.25f, N, V);
  t.expect_near(dlogits, N * V, rel, "cross_entropy_backward");

  const std::vector<float> big = randn(100000, 13);
  const auto sq = t.floats(big);
  EXPECT_NEAR(cpu->sum_of_squares(sq.first, big.size()), gpu->sum_of_squares(sq.second, big.size()),
              1e-9 * cpu->sum_of_squares(sq.first, big.size()));
}

TEST(CudaBackend, TinyModelLogitsLossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const GptConfig config{
      .vocab_size = 64, .context_length = 16, .n_layer = 2, .n_head = 4, .n_embd = 32};
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend();
  Gpt a(config, *cpu, 2, 16), b(config, *gpu, 2, 16);
  a.init_weights(5);
  b.set_params(a.params_to_host());
  Rng rng(9);
  std::vector<int32_t> tokens(32), targets(32);
  for (int i = 0; i < 32; i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % 64);
    targets[i] = static_cast<int32_t>(rng.next_u64() % 64);
  }
  a.zero_grads();
  b.zero_grads();
  const float la = a.forward(tokens.data(), targets.data(), 2, 16);
  const float lb = b.forward(tokens.data(), targets.data(), 2, 16);
  EXPECT_NEAR(la, lb, 1e-5 * la);
  a.backward();
  b.backward();
  const auto ga = a.grads_to_host(), gb = b.grads_to_host();
  for (const ParamView& view : a.layout().views()) {
    double scale = 0;
    for (size_t i = 0; i < view.numel; i++)
      scale = std::max(scale, std::fabs(static_cast<double>(ga[view.offset + i])));
    for (size_t i = 0; i < view.numel; i++)
      ASSERT_NEAR(ga[view.offset + i], gb[view.offset + i], 1e-4 * scale + 1e-7)
          << view.name << "[" << i << "]";
  }
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

TEST(CudaBackend, FiftyTrainingStepsMatchTheCpuRun) {
  SKIP_WITHOUT_GPU();
  testing::ScratchDir dir("cuda_training");
  TrainOptions options;
  options.show_progress = false;
  std::vector<std::vector<double>> runs;
  for (const char* type : {"cpu", "cuda"}) {
    nlohmann::json json = testing::tiny_run_config(
        std::string(TANDEM_SOURCE_DIR) + "/data/tinyshakespeare.txt", dir / type);
    json["train"]["steps"] = 50;
    json["device"] = {{"type", type}};
    options.metrics_path = dir / (std::string(type) + ".jsonl");
    train(parse_train_config(json), options);
    runs.push_back(losses_of(options.metrics_path));
  }
  ASSERT_EQ(runs[0].size(), 50u);
  ASSERT_EQ(runs[1].size(), 50u);
  for (size_t i = 0; i < 50; i++)
    EXPECT_NEAR(runs[0][i], runs[1][i], 2e-3 * runs[0][i]) << "step " << i + 1;
}

TEST(CudaBackend, EveryScheduleTrainsToTheSameBitsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  testing::ScratchDir dir("cuda_schedules");
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
    json["zero_optimization"] = {{"sub_group_size", 1000}};
    json["offload_optimizer"] = {{"schedule", schedule}};
    const TrainResult result = train(parse_train_config(json), quiet);
    if (first.empty()) first = result.state_digest;
    EXPECT_EQ(result.state_digest, first) << schedule;
  }
}

}  // namespace
}  // namespace tandem
