// tandem's Llama against an independent PyTorch implementation (float64), through the
// committed fixture tests/fixtures/llama_tiny.safetensors made by
// tools/make_llama_fixture.py: logits, loss, every gradient, the pre-clip gradient norms
// and the parameters after 3 clipped AdamW steps. The fixture has grouped-query heads
// (4 query heads on 2 key/value heads), an odd vocabulary and head size 6, and an untied
// head; tolerances as in test_gpt2_fixture.cc (fp32 against float64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model_checks.h"
#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/device/device.h"
#include "tandem/model/llama.h"
#include "test_util.h"

namespace tandem {
namespace {

const std::string kFixture =
    (testing::source_dir() / "tests" / "fixtures" / "llama_tiny.safetensors").string();

struct Fixture {
  SafetensorsFile file = SafetensorsFile::read(kFixture);
  ModelConfig config;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;

  Fixture() {
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
  Fixture fx;
  const ParamLayout layout = llama_layout(fx.config);
  const std::vector<float> params = fx.params(layout);
  const testing::ScratchDir dir("llama_export");
  const auto path = dir / "model.safetensors";
  write_hf_safetensors(path, layout, params.data());
  const SafetensorsFile written = SafetensorsFile::read(path);
  for (const ParamView& view : layout.views()) {
    ASSERT_EQ(written.info(view.name).shape, fx.file.info(view.name).shape) << view.name;
    const auto a = written.bytes(view.name);
    const auto b = fx.file.bytes(view.name);
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << view.name;
  }
}

}  // namespace
}  // namespace tandem
