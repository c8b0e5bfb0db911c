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

#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/device/device.h"
#include "tandem/model/llama.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/grad_clip.h"
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

  const std::vector<float> grads = model.grads_to_host();
  const std::vector<float> expected_grads = fx.params(model.layout(), "grad.");
  for (const ParamView& view : model.layout().views()) {
    double max_abs = 0.0;
    for (size_t i = 0; i < view.numel; i++)
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(expected_grads[view.offset + i])));
    ASSERT_GT(max_abs, 0.0) << view.name << " has no gradient in the fixture";
    const double tolerance = 1e-7 + 1e-4 * max_abs;
    for (size_t i = 0; i < view.numel; i++)
      ASSERT_NEAR(grads[view.offset + i], expected_grads[view.offset + i], tolerance)
          << view.name << "[" << i << "]";
  }
}

TEST(LlamaFixture, ThreeClippedAdamWStepsMatchPyTorch) {
  Fixture fx;
  auto backend = make_cpu_backend();
  Llama model(fx.config, *backend, fx.B, fx.T);
  model.set_params(fx.params(model.layout()));
  AdamWHyper hyper{.lr = static_cast<float>(fx.meta("lr")),
                   .beta1 = static_cast<float>(fx.meta("beta1")),
                   .beta2 = static_cast<float>(fx.meta("beta2")),
                   .eps = static_cast<float>(fx.meta("eps")),
                   .weight_decay = static_cast<float>(fx.meta("weight_decay"))};
  const float max_norm = static_cast<float>(fx.meta("max_norm"));
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
