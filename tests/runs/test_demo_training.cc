// DeMo in the trainer (optimizer.type "DeMo"), on in-process ranks: every offload schedule
// and subgroup size gives the same bits, in fp32 and bf16; the ranks hold identical
// parameters and prove it; resume is bit-exact at one and several ranks; each rank sends a
// small fraction of what a gradient all-reduce moves; bad configs and mismatched resumes
// are one-line errors naming the key.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/local_group.h"
#include "tandem/config/memory_plan.h"
#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/model/model_family.h"
#include "tandem/model/param_layout.h"
#include "tandem/optim/demo/demo_rule.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

// ~62k parameters whose tensors give DeMo full 64 x 64 blocks (c_attn [192, 64]), short
// ones (wpe [16, 64]) and 1-D chunks (biases, norms).
nlohmann::json demo_config(const fs::path& data, const fs::path& out) {
  nlohmann::json json = testing::tiny_run_config(data, out);
  json["model"]["n_embd"] = 64;
  json["gradient_accumulation_steps"] = 1;
  json["optimizer"] = {{"type", "DeMo"},
                       {"params", {{"lr", 3e-3}, {"weight_decay", 0.01}, {"compression_topk", 8}}}};
  json["demo"] = {{"replica_check_interval", 2}};
  json["zero_optimization"] = {{"sub_group_size", 5000}};
  json["train"]["steps"] = 6;
  json["train"]["eval_interval"] = 3;
  return json;
}

using testing::expect_ranks_agree;
using testing::losses;
using testing::RankResults;
using testing::same_bits;
using testing::train_on_ranks;

class DemoTraining : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_small_corpus(dir_ / "data.txt"); }
  fs::path data() const { return dir_ / "data.txt"; }
  testing::ScratchDir dir_{"demo_training"};
};

TEST_F(DemoTraining, EveryScheduleAndSubgroupSizeGivesTheSameBits) {
  TrainOptions options;
  options.save_checkpoints = false;
  for (bool bf16 : {false, true}) {
    nlohmann::json reference_json = demo_config(data(), dir_ / "ref");
    reference_json["bf16"] = {{"enabled", bf16}};
    reference_json["offload_optimizer"] = {{"schedule", "cpu"}};
    reference_json["zero_optimization"]["sub_group_size"] = 1'000'000;  // one subgroup
    const RankResults reference = train_on_ranks(3, reference_json, options);
    expect_ranks_agree(reference, cat("bf16 ", bf16, ", reference"));
    ASSERT_EQ(reference.by_rank[0].steps.size(), 6u);
    for (const char* schedule : {"cpu", "device", "ratio", "interleave"}) {
      nlohmann::json json = demo_config(data(), dir_ / "run");
      json["bf16"] = {{"enabled", bf16}};
      json["offload_optimizer"] = {{"schedule", schedule}, {"ratio", 0.5}, {"stride", 2}};
      const std::string what = cat("bf16 ", bf16, ", schedule ", schedule);
      const RankResults run = train_on_ranks(3, json, options);
      expect_ranks_agree(run, what);
      EXPECT_EQ(run.by_rank[0].state_digest, reference.by_rank[0].state_digest) << what;
      EXPECT_EQ(losses(run.by_rank[0]), losses(reference.by_rank[0])) << what;
    }
  }
}

TEST_F(DemoTraining, LossFallsOnOneRankAndOnSeveral) {
  TrainOptions options;
  options.save_checkpoints = false;
  for (int world : {1, 2}) {
    nlohmann::json json = demo_config(data(), dir_ / "loss");
    json["train"]["steps"] = 20;
    json["train"]["eval_interval"] = 0;
    const RankResults run = train_on_ranks(world, json, options);
    expect_ranks_agree(run, cat(world, " ranks"));
    const std::vector<float> l = losses(run.by_rank[0]);
    ASSERT_EQ(l.size(), 20u);
    // From ln(256) = 5.55 at the start.
    EXPECT_LT(l.back(), l.front() - 1.0f) << world << " ranks";
  }
}

TEST_F(DemoTraining, ResumeIsBitExactOnOneRankAndOnSeveral) {
  for (int world : {1, 3}) {
    const std::string tag = cat("w", world);
    nlohmann::json straight_json = demo_config(data(), dir_ / (tag + "straight"));
    straight_json["train"]["steps"] = 8;
    const RankResults straight = train_on_ranks(world, straight_json);
    expect_ranks_agree(straight, "straight");

    nlohmann::json split_json = demo_config(data(), dir_ / (tag + "split"));
    split_json["train"]["steps"] = 8;
    TrainOptions first;
    first.stop_at_step = 5;
    expect_ranks_agree(train_on_ranks(world, split_json, first), "first part");
    TrainOptions second;
    second.resume = dir_ / (tag + "split");
    const RankResults resumed = train_on_ranks(world, split_json, second);
    expect_ranks_agree(resumed, "resumed");
    ASSERT_EQ(resumed.by_rank[0].steps_done, 8);
    // The digest covers the parameters and every rank's momentum.
    EXPECT_EQ(resumed.by_rank[0].state_digest, straight.by_rank[0].state_digest) << world;
    EXPECT_EQ(resumed.by_rank[0].last_val_loss, straight.by_rank[0].last_val_loss) << world;

    // The momentum is in the checkpoint: one file at one rank, a whole shard per rank else.
    const fs::path ckpt = straight.by_rank[0].last_checkpoint;
    const nlohmann::json manifest = checkpoint_manifest(ckpt);
    if (world == 1) {
      EXPECT_TRUE(fs::exists(ckpt / "optimizer.safetensors"));
      const TrainingState state = load_training_checkpoint(ckpt);
      ASSERT_EQ(state.optimizer_state.size(), 1u);
      const std::vector<float>& delta = state.optimizer_array("delta");
      size_t nonzero = 0;
      for (float d : delta) nonzero += d != 0.0f;
      EXPECT_GT(nonzero, delta.size() / 2);
    } else {
      const nlohmann::json& shards = manifest.at("optimizer_shards");
      EXPECT_EQ(shards.at("per_rank"), true);
      ASSERT_EQ(shards.at("shards").size(), 3u);
      // Each rank's momentum is its own.
      std::vector<std::vector<float>> deltas;
      for (int r = 0; r < 3; r++)
        deltas.push_back(
            load_training_checkpoint(ckpt, {.rank = r, .world_size = 3}).optimizer_array("delta"));
      EXPECT_NE(deltas[0], deltas[1]);
      EXPECT_NE(deltas[1], deltas[2]);
    }
  }
}

TEST_F(DemoTraining, ResumingWithAnotherWorldSizeOrOptimizerIsRefusedNamingIt) {
  nlohmann::json json = demo_config(data(), dir_ / "demo3");
  json["train"]["steps"] = 2;
  expect_ranks_agree(train_on_ranks(3, json), "3 ranks");
  TrainOptions resume;
  resume.resume = dir_ / "demo3";
  json["train"]["steps"] = 4;
  const RankResults two = train_on_ranks(2, json, resume);
  for (const std::string& error : two.errors) {
    EXPECT_CONTAINS(error, "of each of 3 ranks");
    EXPECT_CONTAINS(error, "resume it with 3 ranks, not 2");
  }

  // An AdamW run's checkpoint resumed as DeMo (and the reverse).
  nlohmann::json adamw = testing::tiny_run_config(data(), dir_ / "adamw");
  adamw["model"]["n_embd"] = 64;
  adamw["gradient_accumulation_steps"] = 1;
  adamw["train"]["steps"] = 2;
  expect_ranks_agree(train_on_ranks(1, adamw), "AdamW");
  nlohmann::json as_demo = demo_config(data(), dir_ / "elsewhere");
  as_demo["train"]["steps"] = 4;
  TrainOptions from_adamw;
  from_adamw.resume = dir_ / "adamw";
  const RankResults refused = train_on_ranks(1, as_demo, from_adamw);
  EXPECT_CONTAINS(refused.errors[0],
                  "optimizer.type: the checkpoint was written with AdamW, the "
                  "config says DeMo");
  EXPECT_EQ(refused.errors[0].find('\n'), std::string::npos) << refused.errors[0];
  nlohmann::json demo1 = demo_config(data(), dir_ / "demo1");
  demo1["train"]["steps"] = 2;
  expect_ranks_agree(train_on_ranks(1, demo1), "DeMo");
  adamw["train"]["steps"] = 4;
  adamw["train"]["output_dir"] = (dir_ / "adamw_from_demo").string();
  TrainOptions from_demo;
  from_demo.resume = dir_ / "demo1";
  EXPECT_CONTAINS(train_on_ranks(1, adamw, from_demo).errors[0],
                  "written with DeMo, the config says AdamW");
}

TEST_F(DemoTraining, EachRankSendsAFractionOfAGradientAllReduce) {
  TrainOptions options;
  options.save_checkpoints = false;
  options.metrics_path = dir_ / "metrics.jsonl";
  nlohmann::json json = demo_config(data(), dir_ / "bytes");
  json["optimizer"]["params"]["compression_topk"] = 32;
  json["train"]["eval_interval"] = 0;
  const int world = 4;
  const RankResults run = train_on_ranks(world, json, options);
  expect_ranks_agree(run, "4 ranks");
  const size_t P = static_cast<size_t>(parse_train_config(json).model.num_parameters());
  const double ring = 2.0 * (world - 1) / world * 4.0 * static_cast<double>(P);
  const TrainConfig config = parse_train_config(json);
  const double exchange = optimizer_family(OptimizerType::kDeMo)
                              .exchange_bytes(config.optimizer, model_layout(config.model), world);
  std::ifstream metrics(dir_ / "metrics.jsonl");
  std::string line;
  int steps = 0, checks = 0;
  while (std::getline(metrics, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.contains("loss")) continue;
    steps++;
    const auto sent = record.at("comm_bytes_sent").get<double>();
    EXPECT_EQ(record.at("ring_allreduce_bytes").get<double>(), std::floor(ring));
    // The tiny model's short tensors send a larger share than GPT-2's (where it is ~60x
    // less), but still far less than the all-reduce.
    EXPECT_LT(sent * 10, ring) << line;
    EXPECT_GT(sent, 0) << line;
    // What the step planner costs the exchange at (optimizer_family.h exchange_bytes); the
    // rest is the step's loss and the replica check's hashes, a few bytes.
    EXPECT_NEAR(sent, exchange, 0.02 * exchange) << line;
    checks += record.value("replicas_identical", false);
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(checks, 3);  // every demo.replica_check_interval = 2 steps
}

TEST(DemoReplicas, DifferingBitsOnAnyRankStopEveryRankNamingIt) {
  std::vector<std::string> errors(3);
  run_local_ranks(3, [&](Communicator& comm) {
    std::vector<float> params(1000, 1.0f);
    if (comm.rank() == 2) params[999] = std::nextafter(1.0f, 2.0f);
    try {
      require_same_bits_on_every_rank(comm, params.data(), params.size() * sizeof(float),
                                      "the parameters", "resume from the last checkpoint");
    } catch (const Error& e) {
      errors[comm.rank()] = e.what();
    }
  });
  for (const std::string& error : errors) {
    EXPECT_CONTAINS(error, "the parameters differ between the ranks (rank 2: ");
    EXPECT_EQ(error.find("rank 1:"), std::string::npos) << error;
  }
  std::vector<int> passed(3, 0);
  run_local_ranks(3, [&](Communicator& comm) {
    const std::vector<float> same(1000, 1.0f);
    require_same_bits_on_every_rank(comm, same.data(), same.size() * sizeof(float), "x", "y");
    passed[comm.rank()] = 1;
  });
  EXPECT_EQ(passed, std::vector<int>(3, 1));
}

TEST_F(DemoTraining, ThePlanHoldsEightBytesPerParameterAndCutsAtTensorEnds) {
  nlohmann::json json = demo_config(data(), dir_ / "plan");
  json["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 2}};
  const TrainConfig config = parse_train_config(json);
  const std::unique_ptr<Device> device = make_training_device(config);
  ThreadPool pool(1);
  const TrainingMemoryPlan plan = plan_training(config, *device, pool);
  const size_t P = plan.num_params;
  EXPECT_EQ(plan.state_bytes_per_param, 8u);
  EXPECT_EQ(plan.total.host, 8 * P);
  EXPECT_EQ(plan.model_state_bytes(), plan.model_bytes + 8 * P);
  EXPECT_CONTAINS(plan.to_text(), "fp32 params, delta");
  std::vector<size_t> ends;
  const ParamLayout layout = model_layout(config.model);
  for (const ParamView& view : layout.views()) ends.push_back(view.offset + view.numel);
  ASSERT_GT(plan.offload.subgroups.size(), 3u);
  for (const Subgroup& sg : plan.offload.subgroups)
    EXPECT_NE(std::find(ends.begin(), ends.end(), sg.end), ends.end()) << sg.end;
}

TEST_F(DemoTraining, BadConfigsAreOneLineErrorsNamingTheKey) {
  struct Case {
    std::string key;
    nlohmann::json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"/optimizer/params/compression_chunk", 0, "optimizer.params.compression_chunk"},
      {"/optimizer/params/compression_topk", 0, "optimizer.params.compression_topk"},
      {"/optimizer/params/compression_values", "int8", "optimizer.params.compression_values"},
      {"/optimizer/params/compression_decay", 1.0, "optimizer.params.compression_decay"},
      {"/optimizer/params/betas",
       {0.9, 0.95},
       "optimizer.params.betas is a parameter of "
       "optimizer.type AdamW"},
      {"/zero_optimization/stage", 1, "needs zero_optimization.stage 0"},
      {"/offload_optimizer/schedule", "auto", "offload_optimizer.schedule auto"},
      {"/optimizer/type", "Lion",
       "optimizer.type must be one of: \"AdamW\", \"DeMo\", \"SGD\"; got \"Lion\""},
  };
  for (const Case& c : cases) {
    nlohmann::json json = demo_config(data(), dir_ / "bad");
    json[nlohmann::json::json_pointer(c.key)] = c.value;
    const std::string error = testing::error_of([&] { parse_train_config(json); });
    EXPECT_CONTAINS(error, c.expected);
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  // DeMo's keys under AdamW.
  nlohmann::json adamw = testing::tiny_run_config(data(), dir_ / "bad");
  adamw["optimizer"]["params"]["compression_topk"] = 8;
  EXPECT_CONTAINS(testing::error_of([&] { parse_train_config(adamw); }),
                  "optimizer.params.compression_topk is a parameter of optimizer.type DeMo");
  adamw["optimizer"]["params"].erase("compression_topk");
  adamw["demo"] = {{"replica_check_interval", 5}};
  EXPECT_CONTAINS(testing::error_of([&] { parse_train_config(adamw); }),
                  "demo.replica_check_interval applies to optimizer.type DeMo only");
  // A top-k larger than a tensor's blocks is not an error: it is clamped to each tensor's
  // block, as the reference does (optim/demo/demo.h, demo_topk), here every tensor's.
  nlohmann::json big = demo_config(data(), dir_ / "big");
  big["optimizer"]["params"]["compression_topk"] = 5000;
  big["train"]["steps"] = 2;
  const RankResults run = train_on_ranks(1, big);
  EXPECT_EQ(run.errors[0], "");
  // Defaults: weight decay 0 for DeMo, the paper's compression settings.
  nlohmann::json defaults = testing::tiny_run_config(data(), dir_ / "d");
  defaults["optimizer"] = {{"type", "demo"}};
  const TrainConfig config = parse_train_config(defaults);
  EXPECT_EQ(config.optimizer.type, OptimizerType::kDeMo);
  EXPECT_EQ(config.optimizer.weight_decay, 0.0);
  EXPECT_EQ(own_settings<DemoSettings>(config.optimizer).compression_decay, 0.999f);
  EXPECT_EQ(own_settings<DemoSettings>(config.optimizer).compression_topk, 32);
  EXPECT_EQ(own_settings<DemoSettings>(config.optimizer).compression_chunk, 64);
  EXPECT_EQ(own_settings<DemoSettings>(config.optimizer).replica_check_interval, 100);
  // The written config reads back the same.
  EXPECT_EQ(to_json(parse_train_config(to_json(config))), to_json(config));
}

}  // namespace
}  // namespace tandem
