// tandem's GPT-2 against an independent PyTorch implementation (float64), through the
// committed fixture tests/fixtures/gpt2_tiny.safetensors made by
// tools/make_gpt2_fixture.py: logits, loss, every gradient, the pre-clip gradient
// norms and the parameters after 3 clipped AdamW steps.
//
// Tolerances: tandem computes in fp32, the fixture in float64; the loss has a few
// hundred fp32 operations of depth, so we allow ~1e-5 relative on values of order 1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/device/device.h"
#include "tandem/model/gpt.h"
#include "tandem/model/model_family.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/grad_clip.h"
#include "test_util.h"

namespace tandem {
namespace {

const std::string kFixture =
    (testing::source_dir() / "tests" / "fixtures" / "gpt2_tiny.safetensors").string();

struct Fixture {
  SafetensorsFile file = SafetensorsFile::read(kFixture);
  ModelConfig config;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;

  Fixture() {
    auto meta = [&](const char* key) { return std::stod(file.metadata().at(key)); };
    config.vocab_size = static_cast<int>(meta("vocab_size"));
    config.context_length = static_cast<int>(meta("context_length"));
    config.n_layer = static_cast<int>(meta("n_layer"));
    config.n_head = static_cast<int>(meta("n_head"));
    config.n_embd = static_cast<int>(meta("n_embd"));
    B = static_cast<int>(meta("batch_size"));
    T = static_cast<int>(meta("seq_len"));
    tokens = file.read_i32("tokens", {B, T});
    targets = file.read_i32("targets", {B, T});
  }
  double meta(const char* key) const { return std::stod(file.metadata().at(key)); }
  std::vector<float> params(const ParamLayout& layout, const std::string& prefix = "") const {
    std::vector<float> p(layout.num_elements());
    read_hf_safetensors(file, layout, p.data(), prefix);
    return p;
  }
};

TEST(Gpt2Fixture, LogitsLossAndGradientsMatchPyTorch) {
  Fixture fx;
  auto backend = make_cpu_backend();
  Gpt model(fx.config, *backend, fx.B, fx.T);
  model.set_params(fx.params(model.layout()));
  model.zero_grads();
  const float loss = model.forward(fx.tokens.data(), fx.targets.data(), fx.B, fx.T);
  model.backward();

  const float expected_loss = fx.file.read_f32("loss", {})[0];
  EXPECT_NEAR(loss, expected_loss, 1e-5 * expected_loss);

  const std::vector<float> logits = model.logits_to_host();
  const std::vector<float> expected_logits =
      fx.file.read_f32("logits", {fx.B, fx.T, fx.config.vocab_size});
  ASSERT_EQ(logits.size(), expected_logits.size());
  for (size_t i = 0; i < logits.size(); i++)
    ASSERT_NEAR(logits[i], expected_logits[i], 2e-5 + 2e-5 * std::fabs(expected_logits[i])) << i;

  const std::vector<float> grads = model.grads_to_host();
  const std::vector<float> expected_grads = fx.params(model.layout(), "grad.");
  for (const ParamView& view : model.layout().views()) {
    double max_abs = 0.0;
    for (size_t i = 0; i < view.numel; i++)
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(expected_grads[view.offset + i])));
    // Relative to the tensor's largest gradient: tiny entries carry fp32 rounding noise.
    const double tolerance = 1e-7 + 1e-4 * max_abs;
    for (size_t i = 0; i < view.numel; i++)
      ASSERT_NEAR(grads[view.offset + i], expected_grads[view.offset + i], tolerance)
          << view.name << "[" << i << "]";
  }
}

TEST(Gpt2Fixture, ThreeClippedAdamWStepsMatchPyTorch) {
  Fixture fx;
  auto backend = make_cpu_backend();
  Gpt model(fx.config, *backend, fx.B, fx.T);
  model.set_params(fx.params(model.layout()));
  AdamWHyper hyper{.lr = static_cast<float>(fx.meta("lr")),
                   .beta1 = static_cast<float>(fx.meta("beta1")),
                   .beta2 = static_cast<float>(fx.meta("beta2")),
                   .eps = static_cast<float>(fx.meta("eps")),
                   .weight_decay = static_cast<float>(fx.meta("weight_decay"))};
  const float max_norm = static_cast<float>(fx.meta("max_norm"));
  // The optimizer as training runs it: the update engine, here interleaving CPU and
  // (CPU-backend) device updates, which must not change a bit.
  const size_t P = model.layout().num_elements();
  ThreadPool pool(2);
  auto device = make_cpu_device({});
  UpdateEngine engine(
      *device, pool, model.layout(),
      make_offload_plan(
          {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 4096, .stride = 2}, P),
      hyper, {model.params(), model.grads()});
  const std::vector<float> zeros(P, 0.0f);
  engine.load_state(model.params_to_host().data(), zeros.data(), zeros.data(), 0);
  for (int step = 1; step <= 3; step++) {
    model.zero_grads();
    model.forward(fx.tokens.data(), fx.targets.data(), fx.B, fx.T);
    model.backward();
    const double norm = global_grad_norm(model.grads_as<float>(), P);
    const float expected_norm = fx.file.read_f32("grad_norm.step" + std::to_string(step), {})[0];
    EXPECT_NEAR(norm, expected_norm, 1e-5 * expected_norm) << "step " << step;
    const float scale = clip_scale(norm, max_norm);
    ASSERT_LT(scale, 1.0f) << "the fixture is built so that clipping triggers every step";
    engine.step(hyper.lr, scale);
  }

  const std::vector<float> params = model.params_to_host();
  const std::vector<float> expected = fx.params(model.layout(), "adamw3.");
  const int C = fx.config.n_embd;
  for (const ParamView& view : model.layout().views()) {
    // The key bias of attention has an exactly-zero gradient (softmax is invariant to
    // it); fp32 rounding noise there is amplified by Adam's normalisation, so those C
    // entries only need to stay within a few lr of the reference.
    const bool key_bias = view.name.ends_with("attn.c_attn.bias");
    for (size_t i = 0; i < view.numel; i++) {
      const bool noisy = key_bias && i >= static_cast<size_t>(C) && i < 2 * static_cast<size_t>(C);
      const double tolerance = noisy ? 3e-2 : 2e-5;
      ASSERT_NEAR(params[view.offset + i], expected[view.offset + i], tolerance)
          << view.name << "[" << i << "]";
    }
  }
}

TEST(Gpt2Fixture, SafetensorsExportRoundTripsTheHuggingFaceLayout) {
  Fixture fx;
  const ParamLayout layout = model_layout(fx.config);
  const std::vector<float> params = fx.params(layout);
  const auto path = std::filesystem::temp_directory_path() /
                    ("tandem_gpt2_export_" + std::to_string(::getpid()) + ".safetensors");
  write_hf_safetensors(path, layout, params.data());
  const SafetensorsFile written = SafetensorsFile::read(path);
  std::filesystem::remove(path);
  // Same names, shapes and bytes as the PyTorch-written Hugging Face tensors.
  for (const ParamView& view : layout.views()) {
    ASSERT_EQ(written.info(view.name).shape, fx.file.info(view.name).shape) << view.name;
    const auto a = written.bytes(view.name);
    const auto b = fx.file.bytes(view.name);
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << view.name;
  }
}

}  // namespace
}  // namespace tandem
