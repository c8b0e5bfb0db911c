// Mixed precision (bf16 storage, fp32 arithmetic) without a GPU: the CPU backend's Bf16
// kernels round each stored result exactly once; the bf16 model's loss and gradients
// agree with the fp32 model's within bf16 accuracy; training with "bf16.enabled" learns,
// resumes and gives bit-identical optimizer state under every update schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/rng.h"
#include "tandem/model/gpt.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

std::vector<Bf16> to_bf16(const std::vector<float>& x) { return testing::stored<Bf16>(x); }

// Random values that are exact in bf16, so fp32 and Bf16 kernels see the same inputs.
std::vector<float> bf16_exact_randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v = testing::randn(n, seed, scale);
  for (float& x : v) x = to_float(from_float<Bf16>(x));
  return v;
}

// Expects got[i] to be want[i] rounded to bf16, bit for bit.
void expect_rounded_once(const std::vector<Bf16>& got, const std::vector<float>& want,
                         const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); i++)
    ASSERT_EQ(got[i].bits, from_float<Bf16>(want[i]).bits)
        << what << "[" << i << "]: fp32 result " << want[i] << ", bf16 got " << to_float(got[i]);
}

TEST(Bf16Kernels, EveryCpuKernelRoundsTheFp32ResultOnce) {
  auto backend = make_cpu_backend();
  StorageKernels<float>& k = backend->kernels<float>();
  StorageKernels<Bf16>& k16 = backend->kernels<Bf16>();
  const int B = 2, T = 5, C = 16, NH = 2, V = 23, OC = 12, N = B * T;
  Rng rng(3);
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % V);
    targets[i] = static_cast<int32_t>(rng.next_u64() % V);
  }
  const auto x = bf16_exact_randn(N * C, 1), y = bf16_exact_randn(N * C, 2);
  const auto w = bf16_exact_randn(OC * C, 4, 0.3f), bias = bf16_exact_randn(OC, 5, 0.1f);
  const auto ln_w = bf16_exact_randn(C, 6, 0.5f), ln_b = bf16_exact_randn(C, 7, 0.5f);
  const auto wte = bf16_exact_randn(V * C, 8), wpe = bf16_exact_randn(T * C, 9);
  const auto qkv = bf16_exact_randn(N * 3 * C, 10), logits = bf16_exact_randn(N * V, 11, 2.0f);
  const auto dout_c = bf16_exact_randn(N * C, 12), dout_oc = bf16_exact_randn(N * OC, 13);
  const auto acc_w = bf16_exact_randn(OC * C, 14, 0.01f), acc_b = bf16_exact_randn(OC, 15, 0.01f);

  {  // out = x + y
    std::vector<float> out(N * C);
    std::vector<Bf16> out16(N * C);
    k.residual_forward(out.data(), x.data(), y.data(), x.size());
    k16.residual_forward(out16.data(), to_bf16(x).data(), to_bf16(y).data(), x.size());
    expect_rounded_once(out16, out, "residual");
  }
  {  // GELU forward and backward
    std::vector<float> out(N * C), din(N * C);
    std::vector<Bf16> out16(N * C), din16(N * C);
    k.gelu_forward(out.data(), x.data(), x.size());
    k16.gelu_forward(out16.data(), to_bf16(x).data(), x.size());
    expect_rounded_once(out16, out, "gelu_forward");
    k.gelu_backward(din.data(), x.data(), y.data(), x.size());
    k16.gelu_backward(din16.data(), to_bf16(x).data(), to_bf16(y).data(), x.size());
    expect_rounded_once(din16, din, "gelu_backward");
  }
  {  // embeddings
    std::vector<float> out(N * C);
    std::vector<Bf16> out16(N * C);
    k.encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    k16.encoder_forward(out16.data(), tokens.data(), to_bf16(wte).data(), to_bf16(wpe).data(), B, T,
                        C);
    expect_rounded_once(out16, out, "encoder_forward");
    // Accumulating: start from non-zero gradients.
    std::vector<float> dwte = bf16_exact_randn(V * C, 16, 0.1f), dwpe = bf16_exact_randn(T * C, 17);
    std::vector<Bf16> dwte16 = to_bf16(dwte), dwpe16 = to_bf16(dwpe);
    k.encoder_backward(dwte.data(), dwpe.data(), dout_c.data(), tokens.data(), B, T, C);
    k16.encoder_backward(dwte16.data(), dwpe16.data(), to_bf16(dout_c).data(), tokens.data(), B, T,
                         C);
    expect_rounded_once(dwte16, dwte, "encoder_backward dwte");
    expect_rounded_once(dwpe16, dwpe, "encoder_backward dwpe");
  }
  {  // LayerNorm forward (fp32 statistics) and backward (accumulating)
    std::vector<float> out(N * C), mean(N), rstd(N), mean16(N), rstd16(N);
    std::vector<Bf16> out16(N * C);
    k.layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), ln_w.data(), ln_b.data(), N,
                        C);
    k16.layernorm_forward(out16.data(), mean16.data(), rstd16.data(), to_bf16(x).data(),
                          to_bf16(ln_w).data(), to_bf16(ln_b).data(), N, C);
    expect_rounded_once(out16, out, "layernorm_forward");
    EXPECT_EQ(mean, mean16);
    EXPECT_EQ(rstd, rstd16);
    std::vector<float> din = y, dw = ln_w, db = ln_b;
    std::vector<Bf16> din16 = to_bf16(y), dw16 = to_bf16(ln_w), db16 = to_bf16(ln_b);
    k.layernorm_backward(din.data(), dw.data(), db.data(), dout_c.data(), x.data(), ln_w.data(),
                         mean.data(), rstd.data(), N, C);
    k16.layernorm_backward(din16.data(), dw16.data(), db16.data(), to_bf16(dout_c).data(),
                           to_bf16(x).data(), to_bf16(ln_w).data(), mean.data(), rstd.data(), N, C);
    expect_rounded_once(din16, din, "layernorm_backward dinp");
    expect_rounded_once(dw16, dw, "layernorm_backward dweight");
    expect_rounded_once(db16, db, "layernorm_backward dbias");
  }
  {  // matmul with and without bias; backward accumulates dweight and dbias
    for (const bool with_bias : {true, false}) {
      std::vector<float> out(N * OC);
      std::vector<Bf16> out16(N * OC);
      const std::vector<Bf16> bias16 = to_bf16(bias);
      k.matmul_forward(out.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
      k16.matmul_forward(out16.data(), to_bf16(x).data(), to_bf16(w).data(),
                         with_bias ? bias16.data() : nullptr, N, C, OC);
      expect_rounded_once(out16, out, "matmul_forward");
    }
    std::vector<float> din(N * C), dw = acc_w, db = acc_b;
    std::vector<Bf16> din16(N * C), dw16 = to_bf16(acc_w), db16 = to_bf16(acc_b);
    k.matmul_backward(din.data(), dw.data(), db.data(), dout_oc.data(), x.data(), w.data(), N, C,
                      OC);
    k16.matmul_backward(din16.data(), dw16.data(), db16.data(), to_bf16(dout_oc).data(),
                        to_bf16(x).data(), to_bf16(w).data(), N, C, OC);
    expect_rounded_once(din16, din, "matmul_backward dinp");
    expect_rounded_once(dw16, dw, "matmul_backward dweight");
    expect_rounded_once(db16, db, "matmul_backward dbias");
  }
  {  // attention: lse stays fp32
    std::vector<float> out(N * C), lse(B * NH * T), lse16(B * NH * T), dqkv(N * 3 * C);
    std::vector<Bf16> out16(N * C), dqkv16(N * 3 * C);
    k.attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, NH, C / NH);
    k16.attention_forward(out16.data(), lse16.data(), to_bf16(qkv).data(), B, T, NH, NH, C / NH);
    expect_rounded_once(out16, out, "attention_forward");
    EXPECT_EQ(lse, lse16);
    // Backward from the bf16 forward's (rounded) output, on both sides.
    std::vector<float> out_rounded(N * C);
    for (size_t i = 0; i < out16.size(); i++) out_rounded[i] = to_float(out16[i]);
    k.attention_backward(dqkv.data(), dout_c.data(), qkv.data(), out_rounded.data(), lse.data(), B,
                         T, NH, NH, C / NH);
    k16.attention_backward(dqkv16.data(), to_bf16(dout_c).data(), to_bf16(qkv).data(), out16.data(),
                           lse.data(), B, T, NH, NH, C / NH);
    expect_rounded_once(dqkv16, dqkv, "attention_backward");
  }
  {  // cross-entropy: fp32 losses
    std::vector<float> losses(N), losses16(N), dlogits(N * V);
    std::vector<Bf16> dlogits16(N * V);
    k.cross_entropy_forward(losses.data(), logits.data(), targets.data(), N, V);
    k16.cross_entropy_forward(losses16.data(), to_bf16(logits).data(), targets.data(), N, V);
    EXPECT_EQ(losses, losses16);
    k.cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), 0.25f, N, V);
    k16.cross_entropy_backward(dlogits16.data(), to_bf16(logits).data(), targets.data(), 0.25f, N,
                               V);
    expect_rounded_once(dlogits16, dlogits, "cross_entropy_backward");
  }
  EXPECT_EQ(k.sum_of_squares(x.data(), x.size()), k16.sum_of_squares(to_bf16(x).data(), x.size()));
}

// A tiny model's loss and gradients in fp32 and bf16 from the same (bf16-exact) weights.
struct Precisions {
  ModelConfig config{
      .vocab_size = 41, .context_length = 12, .n_layer = 2, .n_head = 2, .n_embd = 32};
  int B = 3, T = 11;
  std::unique_ptr<ComputeBackend> backend = make_cpu_backend();
  Gpt f32{config, *backend, B, T, StorageDType::kF32};
  Gpt b16{config, *backend, B, T, StorageDType::kBF16};
  std::vector<int32_t> tokens, targets;
  float loss32 = 0, loss16 = 0;
  std::vector<float> grads32, grads16;

  Precisions() {
    Rng rng(5);
    for (int i = 0; i < B * T; i++) {
      tokens.push_back(static_cast<int32_t>(rng.next_u64() % config.vocab_size));
      targets.push_back(static_cast<int32_t>(rng.next_u64() % config.vocab_size));
    }
    std::vector<float> params = f32.initial_params(9);
    for (float& p : params) p = to_float(from_float<Bf16>(p));
    f32.set_params(params);
    b16.set_params(params);
    EXPECT_EQ(b16.params_to_host(), params);  // exact in bf16: the copies agree
    for (Gpt* model : {&f32, &b16}) {
      model->zero_grads();
      const float loss = model->forward(tokens.data(), targets.data(), B, T);
      model->backward();
      (model == &f32 ? loss32 : loss16) = loss;
      (model == &f32 ? grads32 : grads16) = model->grads_to_host();
    }
  }
};

TEST(Bf16Model, LossAndGradientsMatchTheFp32ModelWithinBf16Accuracy) {
  Precisions p;
  EXPECT_GT(p.loss32, 3.0f);  // about ln(41) at initialisation
  EXPECT_NEAR(p.loss16, p.loss32, 0.01 * p.loss32);
  EXPECT_NE(p.loss16, p.loss32) << "the bf16 model should round its activations";
  // Per tensor: the gradients agree to a few bf16 ulps of the tensor's largest one
  // (errors compound through the layers), and point the same way.
  for (const ParamView& view : p.f32.layout().views()) {
    double max32 = 0, dot = 0, norm32 = 0, norm16 = 0, max_diff = 0;
    for (size_t i = view.offset; i < view.offset + view.numel; i++) {
      const double a = p.grads32[i], b = p.grads16[i];
      max32 = std::max(max32, std::fabs(a));
      max_diff = std::max(max_diff, std::fabs(a - b));
      dot += a * b;
      norm32 += a * a;
      norm16 += b * b;
    }
    if (max32 == 0) continue;  // e.g. wpe rows beyond T
    EXPECT_LT(max_diff, 0.05 * max32) << view.name;
    EXPECT_GT(dot / std::sqrt(norm32 * norm16), 0.999) << view.name;
  }
}

TEST(Bf16Model, AllocatesHalfTheBytesOfFp32ForItsStoredTensors) {
  Precisions p;
  const size_t P = p.f32.layout().num_elements();
  EXPECT_EQ(p.b16.allocated_bytes(),
            2 * sizeof(Bf16) * P + Gpt::activation_bytes(p.config, p.B, p.T, StorageDType::kBF16));
  EXPECT_EQ(p.f32.allocated_bytes(),
            2 * sizeof(float) * P + Gpt::activation_bytes(p.config, p.B, p.T, StorageDType::kF32));
  EXPECT_LT(Gpt::activation_bytes(p.config, p.B, p.T, StorageDType::kBF16),
            0.6 * Gpt::activation_bytes(p.config, p.B, p.T, StorageDType::kF32));
  EXPECT_THROW(p.b16.grads_as<float>(), Error);
  EXPECT_NO_THROW(p.b16.grads_as<Bf16>());
}

nlohmann::json bf16_run(const std::filesystem::path& data, const std::filesystem::path& out) {
  nlohmann::json json = testing::tiny_run_config(data, out);
  json["bf16"] = {{"enabled", true}};
  return json;
}

TEST(Bf16Training, LearnsLikeTheFp32Run) {
  testing::ScratchDir dir("bf16_learns");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions quiet;
  quiet.show_progress = false;
  nlohmann::json json32 = testing::tiny_run_config(dir / "data.txt", dir / "f32");
  const TrainResult f32 = train(parse_train_config(json32), quiet);
  const TrainResult b16 = train(parse_train_config(bf16_run(dir / "data.txt", dir / "b16")), quiet);
  ASSERT_EQ(b16.steps.size(), f32.steps.size());
  EXPECT_LT(b16.last_train_loss, b16.steps.front().loss - 0.5f);
  EXPECT_NEAR(b16.last_val_loss, f32.last_val_loss, 0.05f * f32.last_val_loss);
  EXPECT_NE(b16.state_digest, f32.state_digest);
}

TEST(Bf16Training, EveryScheduleTrainsToTheSameBits) {
  testing::ScratchDir dir("bf16_schedules");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions quiet;
  quiet.show_progress = false;
  std::string first_digest;
  int run = 0;
  for (const char* schedule : {"device", "cpu", "ratio", "interleave", "auto"}) {
    nlohmann::json json = bf16_run(dir / "data.txt", dir / ("run" + std::to_string(run++)));
    json["train"]["steps"] = 4;
    json["gradient_clipping"] = 0.05;
    json["zero_optimization"] = {{"sub_group_size", 1000}};
    json["offload_optimizer"] = {{"schedule", schedule}, {"ratio", 0.4}, {"stride", 3}};
    const TrainResult result = train(parse_train_config(json), quiet);
    if (first_digest.empty()) first_digest = result.state_digest;
    EXPECT_EQ(result.state_digest, first_digest) << schedule;
  }
}

TEST(Bf16Training, ResumesBitExactly) {
  testing::ScratchDir dir("bf16_resume");
  testing::write_small_corpus(dir / "data.txt");
  TrainOptions quiet;
  quiet.show_progress = false;
  nlohmann::json json = bf16_run(dir / "data.txt", dir / "straight");
  json["train"]["steps"] = 8;
  const TrainResult straight = train(parse_train_config(json), quiet);

  json["train"]["output_dir"] = (dir / "split").string();
  TrainOptions first_half = quiet;
  first_half.stop_at_step = 4;
  train(parse_train_config(json), first_half);
  TrainOptions second_half = quiet;
  second_half.resume = (dir / "split").string();
  const TrainResult resumed = train(parse_train_config(json), second_half);
  EXPECT_EQ(resumed.state_digest, straight.state_digest);
  EXPECT_EQ(resumed.last_train_loss, straight.last_train_loss);
}

}  // namespace
}  // namespace tandem
