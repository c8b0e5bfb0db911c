// tandem's Llama against an independent PyTorch implementation (float64), through the
// committed fixture tests/fixtures/llama_tiny.safetensors made by
// tools/make_llama_fixture.py: logits, loss, every gradient, the pre-clip gradient norms
// and the parameters after 3 clipped AdamW steps. The fixture has grouped-query heads
// (4 query heads on 2 key/value heads), an odd vocabulary and head size 6, and an untied
// head; tolerances as in test_gpt2_fixture.cc (fp32 against float64).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/model_checks.h"
#include "support/test_util.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/device/device.h"
#include "tandem/model/llama.h"

namespace tandem {
namespace {

// The fixture's model: a Llama of the sizes in its metadata, Hugging Face's names.
struct Fixture : testing::ModelFixture {
  ModelConfig config;

  Fixture() : ModelFixture("llama_tiny") {
    config.type = ModelType::kLlama;
    config.vocab_size = static_cast<int>(meta("vocab_size"));
    config.context_length = static_cast<int>(meta("max_position_embeddings"));
    config.n_layer = static_cast<int>(meta("num_hidden_layers"));
    config.n_head = static_cast<int>(meta("num_attention_heads"));
    config.n_kv_head = static_cast<int>(meta("num_key_value_heads"));
    config.n_embd = static_cast<int>(meta("hidden_size"));
    config.intermediate_size = static_cast<int>(meta("intermediate_size"));
    config.rms_norm_eps = meta("rms_norm_eps");
    config.rope_theta = meta("rope_theta");
    config.tie_word_embeddings = false;
  }
};

TEST(LlamaFixture, TheFixtureHasGroupedQueryHeadsAndAnUntiedHead) {
  const Fixture fx;
  EXPECT_LT(fx.config.kv_heads(), fx.config.n_head);
  EXPECT_FALSE(fx.config.tie_word_embeddings);
  EXPECT_NE(fx.config.mlp_width(), 4 * fx.config.n_embd);
  EXPECT_EQ(llama_layout(fx.config).num_elements(),
            static_cast<size_t>(fx.config.num_parameters()));
}

TEST(LlamaFixture, LogitsLossAndGradientsMatchPyTorch) {
  Fixture fx;
  auto backend = make_cpu_backend();
  Llama model(fx.config, *backend, fx.B, fx.T);
  testing::expect_logits_loss_and_gradients_match(model, fx);
}

TEST(LlamaFixture, ThreeClippedAdamWStepsMatchPyTorch) {
  Fixture fx;
  auto backend = make_cpu_backend();
  Llama model(fx.config, *backend, fx.B, fx.T);
  model.set_params(fx.params(model.layout()));
  const std::vector<float> params =
      testing::three_clipped_adamw_steps(model, fx.file, fx.tokens, fx.targets, fx.B, fx.T);
  const std::vector<float> expected = fx.params(model.layout(), "adamw3.");
  for (const ParamView& view : model.layout().views())
    for (size_t i = 0; i < view.numel; i++)
      ASSERT_NEAR(params[view.offset + i], expected[view.offset + i], 2e-5)
          << view.name << "[" << i << "]";
}

TEST(LlamaFixture, SafetensorsExportHasTheHuggingFaceNamesShapesAndBytes) {
  const Fixture fx;
  testing::expect_export_is_the_fixtures_tensors(llama_layout(fx.config), fx);
}

}  // namespace
}  // namespace tandem
