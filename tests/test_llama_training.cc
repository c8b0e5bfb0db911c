// Llama through the whole trainer: every offload schedule gives the same bits; every ZeRO
// stage on 2 ranks gives the bits of one rank accumulating 2 micro-batches, in fp32 and in
// bf16; a resumed run continues bit for bit; the checkpoint is a Hugging Face
// LlamaForCausalLM directory (config.json, tensor names) that `train.init_from` starts a
// new run from; and GPT-2 and Llama runs of the same data differ (the model is not ignored).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/model/model_family.h"
#include "tandem/train/train_config.h"
#include "tandem/train/trainer.h"
#include "test_util.h"
#include "train_on_ranks.h"

namespace tandem {
namespace {

using testing::expect_ranks_agree;
using testing::losses;
using testing::RankResults;
using testing::train_on_ranks;

// ~60k parameters: grouped-query heads (4 on 2), an untied head, MLP width 80.
nlohmann::json llama_config(const std::filesystem::path& data, const std::filesystem::path& out) {
  nlohmann::json json = testing::tiny_run_config(data, out);
  json["model"] = {
      {"type", "llama"},          {"vocab_size", 256},       {"max_position_embeddings", 16},
      {"hidden_size", 32},        {"num_hidden_layers", 2},  {"num_attention_heads", 4},
      {"num_key_value_heads", 2}, {"intermediate_size", 80}, {"rope_theta", 500.0}};
  json["train"]["steps"] = 6;
  json["train"]["eval_interval"] = 3;
  return json;
}

class LlamaTraining : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_small_corpus(dir_ / "data.txt"); }
  std::filesystem::path data() const { return dir_ / "data.txt"; }
  TrainOptions quiet() const {
    TrainOptions options;
    options.show_progress = false;
    return options;
  }
  testing::ScratchDir dir_{"llama_training"};
};

TEST_F(LlamaTraining, TheConfigReadsHuggingFaceNamesAndTrainsDownhill) {
  const TrainConfig config = parse_train_config(llama_config(data(), dir_ / "run"));
  EXPECT_EQ(config.model.type, ModelType::kLlama);
  EXPECT_EQ(config.model.kv_heads(), 2);
  EXPECT_FALSE(config.model.tie_word_embeddings) << "LlamaConfig's default";
  EXPECT_EQ(config.model.rms_norm_eps, 1e-6) << "LlamaConfig's default";
  // The config round-trips through its JSON form (what checkpoints store).
  EXPECT_EQ(parse_train_config(to_json(config)).model, config.model);
  nlohmann::json json = llama_config(data(), dir_ / "run");
  json["train"]["steps"] = 20;
  json["train"]["eval_interval"] = 0;
  const TrainResult result = train(parse_train_config(json), quiet());
  ASSERT_EQ(result.steps.size(), 20u);
  EXPECT_LT(result.steps.back().loss, result.steps.front().loss - 0.5f);
}

TEST_F(LlamaTraining, EveryScheduleTrainsToTheSameBits) {
  struct Case {
    const char* schedule;
    size_t sub_group_size;
    int stride;
  };
  std::string first;
  for (const Case& c : {Case{"device", 100000000, 2}, Case{"cpu", 3000, 2}, Case{"ratio", 3000, 2},
                        Case{"interleave", 777, 3}, Case{"auto", 3000, 2}}) {
    nlohmann::json json = llama_config(data(), dir_ / "run");
    json["gradient_clipping"] = 0.05;
    json["zero_optimization"] = {{"sub_group_size", c.sub_group_size}};
    json["offload_optimizer"] = {{"schedule", c.schedule}, {"stride", c.stride}};
    TrainOptions options = quiet();
    options.save_checkpoints = false;
    const TrainResult result = train(parse_train_config(json), options);
    if (first.empty()) first = result.state_digest;
    EXPECT_EQ(result.state_digest, first) << c.schedule << " " << c.sub_group_size;
  }
}

TEST_F(LlamaTraining, EveryZeroStageOnTwoRanksGivesOneRanksAccumulatedBits) {
  TrainOptions options = quiet();
  options.save_checkpoints = false;
  std::vector<std::string> digests;
  for (const bool bf16 : {false, true}) {
    nlohmann::json one_json = llama_config(data(), dir_ / "one");
    one_json["gradient_accumulation_steps"] = 2;
    one_json["bf16"] = {{"enabled", bf16}};
    const RankResults one = train_on_ranks(1, one_json, options);
    expect_ranks_agree(one, "one rank");
    ASSERT_EQ(one.by_rank[0].steps.size(), 6u);
    digests.push_back(one.by_rank[0].state_digest);
    for (int stage : {0, 1, 2, 3}) {
      nlohmann::json json = llama_config(data(), dir_ / "two");
      json["gradient_accumulation_steps"] = 1;
      json["bf16"] = {{"enabled", bf16}};
      json["zero_optimization"] = {{"stage", stage},
                                   {"sub_group_size", 5000},
                                   {"reduce_bucket_size", 7000},
                                   {"allgather_bucket_size", 6000}};
      json["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 2}};
      const std::string what = cat(bf16 ? "bf16" : "fp32", ", stage ", stage);
      const RankResults two = train_on_ranks(2, json, options);
      expect_ranks_agree(two, what);
      EXPECT_EQ(two.by_rank[0].state_digest, one.by_rank[0].state_digest) << what;
      EXPECT_EQ(losses(two.by_rank[0]), losses(one.by_rank[0])) << what;
    }
  }
  EXPECT_NE(digests[0], digests[1]) << "bf16 and fp32 runs must differ: the test can fail";
}

TEST_F(LlamaTraining, AResumedRunContinuesBitForBit) {
  nlohmann::json straight = llama_config(data(), dir_ / "straight");
  const TrainResult whole = train(parse_train_config(straight), quiet());
  nlohmann::json first = llama_config(data(), dir_ / "halves");
  first["train"]["checkpoint_interval"] = 3;
  TrainOptions stop = quiet();
  stop.stop_at_step = 3;
  const TrainResult half = train(parse_train_config(first), stop);
  ASSERT_FALSE(half.last_checkpoint.empty());
  TrainOptions resume = quiet();
  resume.resume = half.last_checkpoint;
  const TrainResult rest = train(parse_train_config(first), resume);
  EXPECT_EQ(rest.state_digest, whole.state_digest);
}

TEST_F(LlamaTraining, CheckpointsAreHuggingFaceLlamaDirectories) {
  nlohmann::json json = llama_config(data(), dir_ / "run");
  json["train"]["checkpoint_interval"] = 6;
  const TrainResult result = train(parse_train_config(json), quiet());
  ASSERT_FALSE(result.last_checkpoint.empty());
  const nlohmann::json hf =
      nlohmann::json::parse(read_file_text(result.last_checkpoint / "config.json"));
  EXPECT_EQ(hf["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(hf["model_type"], "llama");
  EXPECT_EQ(hf["num_key_value_heads"], 2);
  EXPECT_EQ(hf["intermediate_size"], 80);
  EXPECT_EQ(hf["tie_word_embeddings"], false);
  // Hugging Face's config reads back into the same model.
  const TrainConfig config = parse_train_config(json);
  EXPECT_EQ(model_family_of_hf("llama").from_hf_config(hf), config.model);
  const SafetensorsFile weights =
      SafetensorsFile::read(result.last_checkpoint / "model.safetensors");
  EXPECT_EQ(weights.info("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(weights.info("lm_head.weight").shape, (std::vector<int64_t>{256, 32}));
}

}  // namespace
}  // namespace tandem
