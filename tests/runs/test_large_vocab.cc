// A vocabulary above 65,536 ids (Qwen2.5's 151,936) end to end through `tandem`: a uint32
// token shard with ids past 65,535 trains a tiny qwen2 model (the loss starts at ln V), the
// checkpoint's embedding and config.json have every row, and sampling continues a prompt of
// such ids with ids of the whole range.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/file_io.h"
#include "tandem/data/token_shard.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kVocab = 151936;

TEST(LargeVocabulary, AQwenSizedVocabularyTrainsSavesAndSamplesEndToEnd) {
  const testing::ScratchDir dir("large_vocab");
  // Ids over the whole range, most of them past uint16's.
  std::vector<int32_t> tokens(6000);
  for (size_t i = 0; i < tokens.size(); i++)
    tokens[i] = static_cast<int32_t>((i * 7919 + (i % 13) * 104729) % kVocab);
  write_token_shard(dir / "train.bin", tokens, ShardTokenType::kUint32);
  const json config = {
      {"model",
       {{"type", "qwen2"},
        {"vocab_size", kVocab},
        {"max_position_embeddings", 32},
        {"hidden_size", 16},
        {"num_hidden_layers", 1},
        {"num_attention_heads", 2},
        {"num_key_value_heads", 1},
        {"intermediate_size", 32},
        {"tie_word_embeddings", true}}},
      {"data", {{"train_path", (dir / "train.bin").string()}, {"val_fraction", 0.1}}},
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 1},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"train",
       {{"steps", 2},
        {"seq_len", 16},
        {"eval_interval", 0},
        {"checkpoint_interval", 2},
        {"sample_bytes", 0},
        {"output_dir", (dir / "run").string()}}}};
  write_file_atomic(dir / "config.json", config.dump(2));
  const std::string tandem = testing::tandem_binary().string();
  const auto trained =
      testing::run_command(tandem + " train --config " + (dir / "config.json").string() +
                           " --metrics " + (dir / "metrics.jsonl").string() + " 2>&1");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;

  std::ifstream metrics(dir / "metrics.jsonl");
  std::string line;
  std::vector<double> losses;
  while (std::getline(metrics, line)) {
    const json record = json::parse(line);
    if (record.contains("loss") && record.contains("step")) losses.push_back(record["loss"]);
  }
  ASSERT_FALSE(losses.empty());
  EXPECT_NEAR(losses.front(), std::log(double{kVocab}), 0.2) << "a fresh model's loss is ln V";
  for (const double loss : losses) EXPECT_TRUE(std::isfinite(loss));

  const fs::path checkpoint = dir / "run" / "checkpoints" / "step_00000002";
  const SafetensorsFile weights = SafetensorsFile::read(checkpoint / "model.safetensors");
  EXPECT_EQ(weights.info("model.embed_tokens.weight").shape, (std::vector<int64_t>{kVocab, 16}));
  std::ifstream hf_config(checkpoint / "config.json");
  const json hf = json::parse(hf_config);
  EXPECT_EQ(hf["vocab_size"], kVocab);
  EXPECT_EQ(hf["model_type"], "qwen2");

  const auto sampled =
      testing::run_command(tandem + " sample --checkpoint " + checkpoint.string() +
                           " --prompt-tokens 151935,70000,65536 --tokens 40 --seed 3");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
  // The ids are the last line (a note on stderr says they are ids, not text).
  std::string last = sampled.output.substr(0, sampled.output.find_last_not_of('\n') + 1);
  last = last.substr(last.rfind('\n') + 1);
  std::istringstream ids(last);
  int64_t id = 0, count = 0, past_uint16 = 0;
  while (ids >> id) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, kVocab);
    past_uint16 += id > 65535;
    count++;
  }
  EXPECT_EQ(count, 40) << sampled.output;
  EXPECT_GT(past_uint16, 0) << "ids past 65,535 are drawn (most of the vocabulary is)";
}

}  // namespace
}  // namespace tandem
