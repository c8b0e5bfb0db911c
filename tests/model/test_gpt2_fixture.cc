// tandem's GPT-2 against an independent PyTorch implementation (float64), through the
// committed fixture tests/fixtures/gpt2_tiny.safetensors made by
// tools/make_gpt2_fixture.py: logits, loss, every gradient, the pre-clip gradient
// norms and the parameters after 3 clipped AdamW steps.
//
// Tolerances: tandem computes in fp32, the fixture in float64; the loss has a few
// hundred fp32 operations of depth, so we allow ~1e-5 relative on values of order 1.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/model_checks.h"
#include "support/test_util.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/device/device.h"
#include "tandem/model/gpt.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace {

// The fixture's model: GPT-2 of the sizes in its metadata.
struct Fixture : testing::ModelFixture {
  ModelConfig config;

  Fixture() : ModelFixture("gpt2_tiny") {
    config.vocab_size = static_cast<int>(meta("vocab_size"));
    config.context_length = static_cast<int>(meta("context_length"));
    config.n_layer = static_cast<int>(meta("n_layer"));
    config.n_head = static_cast<int>(meta("n_head"));
    config.n_embd = static_cast<int>(meta("n_embd"));
  }
};

TEST(Gpt2Fixture, LogitsLossAndGradientsMatchPyTorch) {
  Fixture fx;
  auto backend = make_cpu_backend();
  Gpt model(fx.config, *backend, fx.B, fx.T);
  testing::expect_logits_loss_and_gradients_match(model, fx);
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
  const Fixture fx;
  testing::expect_export_is_the_fixtures_tensors(model_layout(fx.config), fx);
}

}  // namespace
}  // namespace tandem
