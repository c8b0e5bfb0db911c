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

#include "model_checks.h"
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

  testing::expect_gradients_near(model.layout(), model.grads_to_host(),
                                 fx.params(model.layout(), "grad."));
}

TEST(Gpt2Fixture, ThreeClippedAdamWStepsMatchPyTorch) {
  Fixture fx;
  auto backend = make_cpu_backend();
  Gpt model(fx.config, *backend, fx.B, fx.T);
  model.set_params(fx.params(model.layout()));
  const std::vector<float> params =
      testing::three_clipped_adamw_steps(model, fx.file, fx.tokens, fx.targets, fx.B, fx.T);
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
