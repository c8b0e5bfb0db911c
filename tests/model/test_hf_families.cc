// The Llama family's Hugging Face types against transformers itself, through the committed
// fixtures tests/fixtures/hf_<family>/ (tools/make_hf_family_fixtures.py: a tiny random
// model of each family's real options, saved by save_pretrained, and transformers' own
// float64 logits, loss and gradients on one batch, its fp32 rotary table and a greedy
// continuation). Each family is read as train.init_from reads it (config.json through the
// model family table, the weights from model.safetensors), so CI checks the numerics
// without torch:
//   llama3   rope_type llama3 (all three bands), untied head
//   qwen2    biases on q, k and v, rope_theta 1e6, untied head
//   qwen3    per-head q/k RMSNorm, head_dim 16 with hidden 32 and 4 heads, tied head
//   mistral  head_dim 12 != hidden / heads, sliding_window 4096 >= T
//   smollm2  a tied Llama with one key/value head
// and the loss mask's ignored targets against PyTorch's ignore_index, on the Qwen2 model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "support/model_checks.h"
#include "support/test_util.h"
#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/init_from.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/data/loss_mask.h"
#include "tandem/model/llama.h"
#include "tandem/model/model_family.h"
#include "tandem/train/sampler.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

fs::path fixture_dir(const std::string& family) {
  return testing::source_dir() / "tests" / "fixtures" / ("hf_" + family);
}

// A family's fixture: the model directory as transformers saved it, its config read by
// tandem, and the reference file (testing::ModelFixture's format: tokens, targets, the
// parameters under their names, logits, loss, grad.<name>).
struct HfFamily : testing::ModelFixture {
  std::string family;
  ModelConfig config;

  explicit HfFamily(const std::string& name)
      : ModelFixture("hf_" + name + "/reference"),
        family(name),
        config(read_hf_model_config(fixture_dir(name), "the fixture")) {}
  nlohmann::json hf_config() const {
    std::ifstream in(fixture_dir(family) / "config.json");
    return nlohmann::json::parse(in);
  }
};

class HfFamilies : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Families, HfFamilies,
                         ::testing::Values("llama3", "qwen2", "qwen3", "mistral", "smollm2"),
                         [](const auto& info) { return info.param; });

// What each fixture is meant to exercise, so that a regenerated fixture that lost an
// option fails here rather than passing vacuously.
TEST_P(HfFamilies, TheConfigIsReadWithTheFamilysOptions) {
  const HfFamily fx(GetParam());
  const ModelConfig& c = fx.config;
  const std::string& f = fx.family;
  EXPECT_EQ(model_type_name(c.type), fx.hf_config().at("model_type").get<std::string>());
  EXPECT_EQ(c.rope_scaling.type == RopeType::kLlama3, f == "llama3");
  EXPECT_EQ(c.qkv_bias, f == "qwen2");
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.qk_norm, f == "qwen3");
  EXPECT_EQ(c.head_size() * c.n_head != c.n_embd, f == "qwen3" || f == "mistral");
  EXPECT_EQ(c.sliding_window > 0, f == "mistral");
  EXPECT_EQ(c.tie_word_embeddings, f == "qwen3" || f == "smollm2");
  // Written back, config.json reads as the same model.
  EXPECT_EQ(model_family(c.type).from_hf_config(model_family(c.type).to_hf_config(c)), c);
}

// The layout has exactly the tensors save_pretrained wrote, with their shapes: no tensor
// missing on either side, none unexpected.
TEST_P(HfFamilies, TheLayoutIsTheTensorsTransformersSaved) {
  const HfFamily fx(GetParam());
  const SafetensorsFile saved = SafetensorsFile::read(fixture_dir(fx.family) / "model.safetensors");
  const ParamLayout layout = model_layout(fx.config);
  std::map<std::string, std::vector<int64_t>> ours, theirs;
  for (const ParamView& view : layout.views()) ours[view.name] = view.shape;
  for (const std::string& name : saved.names()) theirs[name] = saved.info(name).shape;
  EXPECT_EQ(ours, theirs);
  EXPECT_EQ(layout.num_elements(), static_cast<size_t>(fx.config.num_parameters()));
}

TEST_P(HfFamilies, TheRotaryTableIsTransformersFp32Table) {
  const HfFamily fx(GetParam());
  const int HS = fx.config.head_size(), half = HS / 2;
  const std::vector<float> table = rope_cos_sin(fx.config, fx.T);
  const std::vector<float> cos = fx.file.read_f32("rope.cos", {fx.T, HS});
  const std::vector<float> sin = fx.file.read_f32("rope.sin", {fx.T, HS});
  for (int t = 0; t < fx.T; t++) {
    for (int i = 0; i < HS; i++) {
      // transformers' table is cat(freqs, freqs): column i and i + HS/2 share an angle.
      const float* cs = table.data() + (static_cast<size_t>(t) * half + i % half) * 2;
      ASSERT_NEAR(cs[0], cos[t * HS + i], 2e-6) << "cos at position " << t << ", column " << i;
      ASSERT_NEAR(cs[1], sin[t * HS + i], 2e-6) << "sin at position " << t << ", column " << i;
    }
  }
}

// Logits within 1e-5 of the largest, the loss within 1e-5 relative and every gradient
// within 1e-4 of its tensor's largest (fp32 against transformers in float64), from the
// weights as init_from reads them.
TEST_P(HfFamilies, LogitsLossAndGradientsMatchTransformers) {
  const HfFamily fx(GetParam());
  auto backend = make_cpu_backend();
  Llama model(fx.config, *backend, fx.B, fx.T);
  const std::vector<float> weights =
      read_init_weights(fixture_dir(fx.family), fx.config, model.layout());
  ASSERT_EQ(weights, fx.params(model.layout())) << "model.safetensors is the reference's weights";
  testing::expect_logits_loss_and_gradients_match(model, fx);
  const std::vector<float> logits = model.logits_to_host();
  const std::vector<float> expected =
      fx.file.read_f32("logits", {fx.B, fx.T, fx.config.vocab_size});
  double largest = 0.0, worst = 0.0;
  for (size_t i = 0; i < logits.size(); i++) {
    largest = std::max(largest, std::fabs(static_cast<double>(expected[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(logits[i]) - expected[i]));
  }
  EXPECT_GT(largest, 1.0) << "the fixture's logits should be of order one or more";
  EXPECT_LE(worst, 1e-5 * largest);
}

TEST_P(HfFamilies, AGreedyContinuationIsTransformers) {
  const HfFamily fx(GetParam());
  const std::vector<int32_t> prompt = fx.file.read_i32(
      "greedy.prompt", {static_cast<int64_t>(fx.file.info("greedy.prompt").shape.at(0))});
  const std::vector<int32_t> expected =
      fx.file.read_i32("greedy.continuation",
                       {static_cast<int64_t>(fx.file.info("greedy.continuation").shape.at(0))});
  auto backend = make_cpu_backend();
  Llama model(fx.config, *backend, 1, fx.config.context_length);
  model.set_params(read_init_weights(fixture_dir(fx.family), fx.config, model.layout()));
  Rng rng(1);
  EXPECT_EQ(sample_tokens(model, prompt, static_cast<int>(expected.size()), rng, 0.0f), expected);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// The loss mask: the targets PyTorch's cross_entropy ignores (ignore_index -100) are
// tandem's kIgnoredTarget; the loss is the mean over the counted ones and the gradients
// are its gradients (tools/make_masked_loss_fixture.py, transformers' Qwen2 in float64). A
// batch of which nothing counts adds nothing.
TEST(HfFamilyMaskedLoss, IgnoredTargetsAreExcludedAsPyTorchsIgnoreIndex) {
  const HfFamily fx("qwen2");
  const SafetensorsFile masked =
      SafetensorsFile::read(fixture_dir("qwen2") / "masked_reference.safetensors");
  std::vector<int32_t> targets = masked.read_i32("targets", {fx.B, fx.T});
  for (int32_t& target : targets)
    if (target == -100) target = kIgnoredTarget;
  auto backend = make_cpu_backend();
  Llama model(fx.config, *backend, fx.B, fx.T);
  model.set_params(fx.params(model.layout()));
  model.zero_grads();
  const float loss = model.forward(fx.tokens.data(), targets.data(), fx.B, fx.T);
  model.backward();
  EXPECT_EQ(model.counted_targets(), std::stoll(masked.metadata().at("counted_targets")));
  EXPECT_LT(model.counted_targets(), fx.B * fx.T);
  const float expected = masked.read_f32("loss", {})[0];
  EXPECT_NEAR(loss, expected, 1e-5 * expected);
  std::vector<float> expected_grads(model.layout().num_elements());
  read_hf_safetensors(masked, model.layout(), expected_grads.data(), "grad.");
  testing::expect_gradients_near(model.layout(), model.grads_to_host(), expected_grads);

  std::vector<int32_t> none(targets.size(), kIgnoredTarget);
  model.zero_grads();
  EXPECT_EQ(model.forward(fx.tokens.data(), none.data(), fx.B, fx.T), 0.0f);
  model.backward();
  EXPECT_EQ(model.counted_targets(), 0);
  for (const float g : model.grads_to_host()) ASSERT_EQ(g, 0.0f);
}

}  // namespace
}  // namespace tandem
