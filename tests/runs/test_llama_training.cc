// Llama through the whole trainer: every offload schedule gives the same bits; every ZeRO
// stage on 2 ranks gives the bits of one rank accumulating 2 micro-batches, in fp32 and in
// bf16; a resumed run continues bit for bit; the checkpoint is a Hugging Face
// LlamaForCausalLM directory (config.json, tensor names) that `train.init_from` starts a
// new run from; and GPT-2 and Llama runs of the same data differ (the model is not ignored).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/init_from.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/config/train_config.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/model/model_family.h"
#include "tandem/train/trainer.h"

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

// DeMo cuts subgroups at tensor ends from the layout, whatever the family: on 2 ranks
// every schedule gives the same bits, and the loss falls.
TEST_F(LlamaTraining, DeMoTrainsALlamaToTheSameBitsUnderEverySchedule) {
  TrainOptions options = quiet();
  options.save_checkpoints = false;
  std::string first;
  for (const char* schedule : {"cpu", "device", "interleave"}) {
    nlohmann::json json = llama_config(data(), dir_ / "demo");
    json["optimizer"] = {
        {"type", "DeMo"},
        {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}, {"compression_topk", 8}}}};
    json["zero_optimization"] = {{"sub_group_size", 3000}};
    json["offload_optimizer"] = {{"schedule", schedule}, {"stride", 2}};
    const RankResults run = train_on_ranks(2, json, options);
    expect_ranks_agree(run, schedule);
    if (first.empty()) first = run.by_rank[0].state_digest;
    EXPECT_EQ(run.by_rank[0].state_digest, first) << schedule;
    EXPECT_LT(run.by_rank[0].steps.back().loss, run.by_rank[0].steps.front().loss) << schedule;
  }
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

namespace tandem {
namespace {

// Hugging Face round trips and `train.init_from`, for both families.
class InitFrom : public LlamaTraining {};

nlohmann::json gpt2_config(const std::filesystem::path& data, const std::filesystem::path& out) {
  nlohmann::json json = testing::tiny_run_config(data, out);
  json["train"]["steps"] = 6;
  json["train"]["eval_interval"] = 0;
  return json;
}

TEST_F(InitFrom, ARunStartsFromACheckpointsWeightsOneFileOrShardedForBothFamilies) {
  for (const bool llama : {true, false}) {
    for (const int64_t shard : {int64_t{5'000'000'000}, int64_t{20'000}}) {
      const std::string what = cat(llama ? "llama" : "gpt2", ", max_shard_size ", shard);
      SCOPED_TRACE(what);
      nlohmann::json json =
          llama ? llama_config(data(), dir_ / "a") : gpt2_config(data(), dir_ / "a");
      json["train"]["max_shard_size"] = shard;
      json["train"]["eval_interval"] = 0;
      json["train"]["steps"] = 30;
      std::filesystem::remove_all(dir_ / "a");
      const TrainResult a = train(parse_train_config(json), quiet());
      ASSERT_FALSE(a.last_checkpoint.empty());
      EXPECT_EQ(std::filesystem::exists(a.last_checkpoint / kWeightIndexFile), shard < 1'000'000);
      // The exported weights read back bit for bit.
      const TrainingState saved = load_checkpoint_weights(a.last_checkpoint);
      const TrainConfig config = parse_train_config(json);
      const std::vector<float> read =
          read_init_weights(a.last_checkpoint, config.model, model_layout(config.model));
      ASSERT_EQ(read.size(), saved.params.size());
      EXPECT_TRUE(testing::same_bits(read, saved.params));
      // A new run from them starts where the first one ended, not from scratch.
      nlohmann::json b_json = json;
      b_json["train"]["output_dir"] = (dir_ / "b").string();
      b_json["train"]["init_from"] = a.last_checkpoint.string();
      b_json["train"]["steps"] = 1;
      std::filesystem::remove_all(dir_ / "b");
      const TrainResult b = train(parse_train_config(b_json), quiet());
      nlohmann::json fresh_json = b_json;
      fresh_json["train"].erase("init_from");
      fresh_json["train"]["output_dir"] = (dir_ / "fresh").string();
      std::filesystem::remove_all(dir_ / "fresh");
      const TrainResult fresh = train(parse_train_config(fresh_json), quiet());
      EXPECT_LT(b.steps[0].loss, fresh.steps[0].loss - 0.3f)
          << "from the checkpoint " << b.steps[0].loss << ", from the seed " << fresh.steps[0].loss;
    }
  }
}

TEST_F(InitFrom, WhatDoesNotFitIsOneLineNamingIt) {
  nlohmann::json json = llama_config(data(), dir_ / "a");
  json["train"]["eval_interval"] = 0;
  const TrainResult a = train(parse_train_config(json), quiet());
  const std::filesystem::path ckpt = a.last_checkpoint;
  auto error_with = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json b = json;
    b["train"]["output_dir"] = (dir_ / "b").string();
    b["train"]["init_from"] = ckpt.string();
    change(b);
    return testing::error_of([&] { train(parse_train_config(b), quiet()); });
  };
  std::string e = error_with([](nlohmann::json& b) { b["model"]["num_hidden_layers"] = 3; });
  EXPECT_NE(e.find("train.init_from " + ckpt.string()), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_layer 2 vs 3"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  e = error_with([](nlohmann::json& b) { b["model"]["num_key_value_heads"] = 4; });
  EXPECT_NE(e.find("model.num_key_value_heads 2 vs 4"), std::string::npos) << e;
  e = error_with([&](nlohmann::json& b) { b["train"]["init_from"] = (dir_ / "nowhere").string(); });
  EXPECT_NE(e.find("not a directory"), std::string::npos) << e;
  // A GPT-2 config from a Llama checkpoint names the type.
  e = error_with(
      [&](nlohmann::json& b) { b["model"] = gpt2_config(data(), dir_.path())["model"]; });
  EXPECT_NE(e.find("model.type llama vs gpt2"), std::string::npos) << e;
  // A tensor missing from the weights is named.
  const testing::ScratchDir broken("init_from_broken");
  std::filesystem::copy_file(ckpt / "config.json", broken / "config.json");
  const TrainConfig config = parse_train_config(json);
  const ParamLayout layout = model_layout(config.model);
  ParamLayout partial;
  for (const ParamView& view : layout.views())
    if (view.name != "model.layers.1.mlp.up_proj.weight")
      partial.add(view.name, view.shape, view.weight_decay);
  const std::vector<float> zeros(partial.num_elements(), 0.0f);
  write_hf_safetensors(broken / "model.safetensors", partial, zeros.data());
  e = testing::error_of([&] { read_init_weights(broken.path(), config.model, layout); });
  EXPECT_NE(e.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e;
}

// `tandem logits` on a Hugging Face model directory (config.json and the weights, nothing of
// tandem's: what transformers' save_pretrained writes) gives the bits it gives on the
// tandem checkpoint those files came from; tests/runs/hf_logits_test.sh checks the same against
// transformers where it is installed.
TEST_F(InitFrom, TandemLogitsReadsAHuggingFaceDirectoryAsItsCheckpoint) {
  nlohmann::json json = llama_config(data(), dir_ / "a");
  json["train"]["eval_interval"] = 0;
  const TrainResult a = train(parse_train_config(json), quiet());
  const testing::ScratchDir hf("logits_hf_dir");
  for (const char* file : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(a.last_checkpoint / file, hf / file);
  const auto logits_of = [&](const std::filesystem::path& dir, const std::string& name) {
    const std::filesystem::path out = dir_ / name;
    const testing::CommandResult r =
        testing::run_command(testing::tandem_binary().string() + " logits --checkpoint " +
                             dir.string() + " --tokens 3,1,4,1,5,9,2,6 --output " + out.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return SafetensorsFile::read(out).read_f32("logits", {1, 8, 256});
  };
  const std::vector<float> from_checkpoint = logits_of(a.last_checkpoint, "ckpt.safetensors");
  const std::vector<float> from_hf = logits_of(hf.path(), "hf.safetensors");
  ASSERT_EQ(from_checkpoint.size(), size_t{8 * 256});
  EXPECT_EQ(from_hf, from_checkpoint);
  // A directory that is neither names what it looked for.
  const testing::CommandResult r = testing::run_command(
      testing::tandem_binary().string() + " logits --checkpoint " + dir_.path().string() +
      " --tokens 1 --output " + (dir_ / "x.safetensors").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not a checkpoint"), std::string::npos) << r.output;
}

// config.json as transformers writes it: version 4 puts rope_theta and rope_scaling at the
// top level, version 5 nests them in rope_parameters (rope_type "default" for plain rotary
// embeddings); both read to the same model, and so do the scalings tandem computes (llama3,
// linear) and attention_bias. Anything tandem does not compute (another rotary scaling, MLP
// biases, another activation or LayerNorm epsilon) is refused by name, never read as the
// plain model.
TEST_F(InitFrom, ConfigJsonOfTransformersFourAndFiveReadAndWhatTandemLacksIsRefused) {
  const ModelFamily& llama = model_family_of_hf("llama");
  const nlohmann::json v4 =
      llama.to_hf_config(parse_train_config(llama_config(data(), dir_ / "c")).model);
  ModelConfig expected = llama.from_hf_config(v4);
  nlohmann::json v5 = v4;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
  expected.rope_theta = 500000.0;
  EXPECT_EQ(llama.from_hf_config(v5), expected) << "rope_parameters.rope_theta is the base";

  const auto error_of = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json hf = v4;
    change(hf);
    return testing::error_of([&] { llama.from_hf_config(hf); });
  };
  nlohmann::json llama3 = v5;
  llama3["rope_parameters"] = {
      {"rope_theta", 500000.0},  {"rope_type", "llama3"},
      {"factor", 8.0},           {"low_freq_factor", 1.0},
      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const ModelConfig scaled = llama.from_hf_config(llama3);
  EXPECT_EQ(scaled.rope_scaling, (RopeScaling{.type = RopeType::kLlama3,
                                              .factor = 8.0,
                                              .low_freq_factor = 1.0,
                                              .high_freq_factor = 4.0,
                                              .original_max_position_embeddings = 8192}));
  EXPECT_EQ(llama.from_hf_config(llama.to_hf_config(scaled)), scaled) << "written as read";
  nlohmann::json linear = v4;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(llama.from_hf_config(linear).rope_scaling.type, RopeType::kLinear);
  nlohmann::json biased = v4;
  biased["attention_bias"] = true;
  EXPECT_TRUE(llama.from_hf_config(biased).qkv_bias && llama.from_hf_config(biased).o_bias);

  std::string e = error_of([](nlohmann::json& hf) {
    hf["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "yarn"}, {"factor", 8.0}};
  });
  EXPECT_NE(e.find("rope_parameters"), std::string::npos) << e;
  EXPECT_NE(e.find("yarn"), std::string::npos) << e;
  e = error_of([](nlohmann::json& hf) {
    hf["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  });
  EXPECT_NE(e.find("rope_scaling"), std::string::npos) << e;
  EXPECT_NE(e.find("dynamic"), std::string::npos) << e;
  e = error_of([](nlohmann::json& hf) {
    hf["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  });
  EXPECT_NE(e.find("low_freq_factor"), std::string::npos) << e;
  e = error_of([](nlohmann::json& hf) {
    hf["rope_theta"] = 10000.0;
    hf["rope_parameters"] = {{"rope_theta", 20000.0}, {"rope_type", "default"}};
  });
  EXPECT_NE(e.find("rope_theta = 10000 but rope_parameters.rope_theta = 20000"), std::string::npos)
      << e;
  e = error_of([](nlohmann::json& hf) { hf["mlp_bias"] = true; });
  EXPECT_NE(e.find("mlp_bias"), std::string::npos) << e;
  e = error_of([](nlohmann::json& hf) { hf["hidden_act"] = "gelu"; });
  EXPECT_NE(e.find("hidden_act \"gelu\""), std::string::npos) << e;

  const ModelFamily& gpt2 = model_family_of_hf("gpt2");
  nlohmann::json hf = gpt2.to_hf_config(parse_train_config(gpt2_config(data(), dir_ / "g")).model);
  hf["layer_norm_epsilon"] = 1e-6;
  e = testing::error_of([&] { gpt2.from_hf_config(hf); });
  EXPECT_NE(e.find("layer_norm_epsilon"), std::string::npos) << e;
}

// Published GPT-2 checkpoints name tensors without the "transformer." prefix and are often
// stored in 16 bits: both read, widened exactly.
TEST_F(InitFrom, BareGpt2NamesAndBf16WeightsRead) {
  const TrainConfig config = parse_train_config(gpt2_config(data(), dir_ / "x"));
  const ParamLayout layout = model_layout(config.model);
  std::vector<uint16_t> bits(layout.num_elements());
  Rng rng(3);
  for (uint16_t& b : bits) b = static_cast<uint16_t>(0x3c00 + rng.next_u64() % 0x0400);  // 1..2
  SafetensorsWriter writer;
  std::vector<std::vector<uint16_t>> transposed;
  for (const ParamView& view : layout.views()) {
    std::string name = view.name.substr(std::string("transformer.").size());
    std::vector<int64_t> shape = view.shape;
    const uint16_t* data = bits.data() + view.offset;
    if (view.hf_transposed) {  // Conv1D: stored [in, out]
      std::vector<uint16_t> t(view.numel);
      for (int64_t r = 0; r < shape[0]; r++)
        for (int64_t c = 0; c < shape[1]; c++) t[c * shape[0] + r] = data[r * shape[1] + c];
      transposed.push_back(std::move(t));
      data = transposed.back().data();
      shape = {shape[1], shape[0]};
    }
    writer.add(name, DType::kBF16, shape, data);
  }
  const testing::ScratchDir hf("init_from_gpt2");
  writer.write(hf / "model.safetensors");
  write_file_atomic(hf / "config.json",
                    model_family(ModelType::kGpt2).to_hf_config(config.model).dump());
  const std::vector<float> read = read_init_weights(hf.path(), config.model, layout);
  for (size_t i = 0; i < bits.size(); i++) ASSERT_EQ(read[i], bf16_to_float(bits[i])) << i;
}

}  // namespace
}  // namespace tandem
