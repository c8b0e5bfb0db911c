// Fine-tuning a model transformers saved, as a user would: a run config with no model
// section and train.init_from naming the model directory (tests/fixtures/hf_<family>,
// made by tools/make_hf_family_fixtures.py, with a tokenizer beside it) trains a few steps
// through `tandem train`; every checkpoint is a Hugging Face model directory of the same
// type with exactly the tensors transformers saved (none missing, none unexpected: what
// from_pretrained checks), the trained weights, and the tokenizer files copied.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/config/train_config.h"
#include "tandem/core/file_io.h"
#include "tandem/data/token_shard.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::map<std::string, std::vector<int64_t>> tensor_shapes(const fs::path& file) {
  const SafetensorsFile weights = SafetensorsFile::read(file);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const std::string& name : weights.names()) shapes[name] = weights.info(name).shape;
  return shapes;
}

class HfFineTune : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Families, HfFineTune,
                         ::testing::Values("llama3", "qwen2", "qwen3", "mistral", "smollm2"),
                         [](const auto& info) { return info.param; });

TEST_P(HfFineTune, InitFromATransformersModelTrainsAndExportsItsTypeWithItsTokenizer) {
  const testing::ScratchDir dir("hf_finetune");
  const fs::path fixture = testing::source_dir() / "tests" / "fixtures" / ("hf_" + GetParam());
  const fs::path model_dir = dir / "model";
  fs::create_directories(model_dir);
  for (const char* name : {"config.json", "model.safetensors"})
    fs::copy_file(fixture / name, model_dir / name);
  const std::string tokenizer = R"({"version": "1.0", "model": {"type": "BPE"}})";
  const std::string tokenizer_config = R"({"chat_template": "{{ messages }}"})";
  write_file_atomic(model_dir / "tokenizer.json", tokenizer);
  write_file_atomic(model_dir / "tokenizer_config.json", tokenizer_config);

  const ModelConfig model = read_hf_model_config(model_dir);
  std::vector<int32_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); i++)
    tokens[i] = static_cast<int32_t>((i * 31 + i / 7) % model.vocab_size);
  write_token_shard(dir / "train.bin", tokens, ShardTokenType::kUint16);
  const json config = {
      {"data", {{"train_path", (dir / "train.bin").string()}, {"val_fraction", 0.1}}},
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"train",
       {{"init_from", model_dir.string()},
        {"steps", 2},
        {"seq_len", 16},
        {"eval_interval", 0},
        {"checkpoint_interval", 2},
        {"sample_bytes", 0},
        {"output_dir", (dir / "run").string()}}}};
  write_file_atomic(dir / "config.json", config.dump(2));
  // No model section: the run's model is init_from's.
  EXPECT_EQ(load_train_config(dir / "config.json", {}).model, model);

  const auto trained = testing::run_command(testing::tandem_binary().string() + " train --config " +
                                            (dir / "config.json").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const fs::path checkpoint = dir / "run" / "checkpoints" / "step_00000002";
  EXPECT_EQ(read_hf_model_config(checkpoint), model);
  const json exported = json::parse(read_file_text(checkpoint / "config.json"));
  const json original = json::parse(read_file_text(fixture / "config.json"));
  EXPECT_EQ(exported["model_type"], original["model_type"]);
  EXPECT_EQ(exported["architectures"], original["architectures"]);
  EXPECT_EQ(tensor_shapes(checkpoint / "model.safetensors"),
            tensor_shapes(fixture / "model.safetensors"));
  const SafetensorsFile before = SafetensorsFile::read(fixture / "model.safetensors");
  const SafetensorsFile after = SafetensorsFile::read(checkpoint / "model.safetensors");
  const auto a = before.bytes("model.norm.weight"), b = after.bytes("model.norm.weight");
  EXPECT_FALSE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "the weights trained";
  EXPECT_EQ(read_file_text(checkpoint / "tokenizer.json"), tokenizer);
  EXPECT_EQ(read_file_text(checkpoint / "tokenizer_config.json"), tokenizer_config);
  EXPECT_FALSE(fs::exists(checkpoint / "special_tokens_map.json")) << "only what init_from had";
}

}  // namespace
}  // namespace tandem
