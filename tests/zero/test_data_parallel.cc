// Data parallelism (zero/data_parallel.h) on in-process ranks: every ZeRO stage and offload
// schedule gives the same bits at one world size; any split of a global batch over ranks
// and micro-batches gives the same bits (powers of two, or one rank); a run resumes on
// another world size bit for bit; the bytes each rank moves match the ZeRO volumes.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "support/block_sums_check.h"
#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/local_group.h"
#include "tandem/comm/tree_sum.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/config/memory_plan.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/step_hooks.h"
#include "tandem/core/thread_pool.h"
#include "tandem/data/loss_mask.h"
#include "tandem/data/token_shard.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/train/trainer.h"
#include "tandem/zero/gradient_accumulator.h"
#include "tandem/zero/partition.h"
#include "tandem/zero/zero_traffic.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

// ~118k parameters: at 2-4 ranks every rank owns a partition of several norm blocks and
// the last one a short one.
nlohmann::json dp_config(const std::filesystem::path& data, const std::filesystem::path& out,
                         int stage, int accum) {
  nlohmann::json json = testing::tiny_run_config(data, out);
  json["model"]["n_embd"] = 64;
  json["gradient_accumulation_steps"] = accum;
  json["zero_optimization"] = {{"stage", stage},
                               {"sub_group_size", 20000},
                               {"reduce_bucket_size", 30000},
                               {"allgather_bucket_size", 25000}};
  json["train"]["steps"] = 6;
  json["train"]["eval_interval"] = 3;
  return json;
}

// The parameters of one layer of dp_config's model (its largest block): 12 C^2 + 13 C.
size_t dp_layer_params() { return 12 * 64 * 64 + 13 * 64; }

using testing::expect_ranks_agree;
using testing::losses;
using testing::RankResults;
using testing::same_bits;
using testing::train_on_ranks;

class DataParallelTraining : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_small_corpus(dir_ / "data.txt"); }
  std::filesystem::path data() const { return dir_ / "data.txt"; }
  testing::ScratchDir dir_{"data_parallel"};
};

TEST_F(DataParallelTraining, EveryStageScheduleAndBucketingGivesTheSameBits) {
  TrainOptions options;
  options.save_checkpoints = false;
  // The reference: stage 0, every collective where it is called.
  nlohmann::json reference_json = dp_config(data(), dir_ / "ref", 0, 1);
  reference_json["zero_optimization"]["overlap_comm"] = false;
  const RankResults reference = train_on_ranks(3, reference_json, options);
  expect_ranks_agree(reference, "stage 0");
  ASSERT_EQ(reference.by_rank[0].steps.size(), 6u);
  for (int stage : {0, 1, 2, 3}) {
    for (const char* schedule : {"cpu", "device", "interleave"}) {
      // overlap_comm: the collectives on the model's buffers run on a queue's thread.
      for (bool overlap : {true, false}) {
        if (std::string(schedule) != "cpu" && !overlap) continue;
        nlohmann::json json = dp_config(data(), dir_ / "run", stage, 1);
        json["offload_optimizer"] = {{"schedule", schedule}, {"stride", 2}};
        json["zero_optimization"]["overlap_comm"] = overlap;
        const std::string what =
            cat("stage ", stage, ", schedule ", schedule, ", overlap_comm ", overlap);
        const RankResults run = train_on_ranks(3, json, options);
        expect_ranks_agree(run, what);
        EXPECT_EQ(run.by_rank[0].state_digest, reference.by_rank[0].state_digest) << what;
        EXPECT_EQ(losses(run.by_rank[0]), losses(reference.by_rank[0])) << what;
        // The queue ran the collectives (its time is reported), or there was none.
        for (const TrainResult& r : run.by_rank) {
          for (const StepRecord& step : r.steps) {
            EXPECT_EQ(step.collective_ms > 0, overlap) << what << ", step " << step.step;
            EXPECT_LE(step.collective_wait_ms, step.ms) << what << ", step " << step.step;
          }
        }
      }
    }
  }
  // Stage 3 with a live buffer of just the two layers (every block gathered for each use
  // but the one still cached), and with room to prefetch the next block.
  const size_t layer = dp_layer_params();
  for (size_t prefetch : {size_t{0}, size_t{20000}}) {
    nlohmann::json json = dp_config(data(), dir_ / "tight", 3, 1);
    json["zero_optimization"]["stage3_param_persistence_threshold"] = 1000;
    json["zero_optimization"]["stage3_max_live_parameters"] =
        2 * layer + prefetch;  // more than needed
    json["zero_optimization"]["stage3_prefetch_bucket_size"] = prefetch;
    const std::string what = cat("stage 3, live ", 2 * layer + prefetch, ", prefetch ", prefetch);
    const RankResults run = train_on_ranks(3, json, options);
    expect_ranks_agree(run, what);
    EXPECT_EQ(run.by_rank[0].state_digest, reference.by_rank[0].state_digest) << what;
    EXPECT_EQ(losses(run.by_rank[0]), losses(reference.by_rank[0])) << what;
    for (const TrainResult& r : run.by_rank) {
      EXPECT_LE(r.peak_live_parameters, 2 * layer) << what;  // two blocks, whatever the budget
      EXPECT_GE(r.peak_live_parameters, 2 * layer) << what;
    }
  }
}

// Stage 3 refuses a stage3_max_live_parameters below the two largest blocks, on every
// rank, before anything is trained, naming the key and the least value.
TEST_F(DataParallelTraining, Stage3RefusesALiveBudgetBelowTwoBlocks) {
  nlohmann::json json = dp_config(data(), dir_ / "small", 3, 1);
  json["zero_optimization"]["stage3_param_persistence_threshold"] = 1000;
  json["zero_optimization"]["stage3_max_live_parameters"] = 50000;
  const RankResults run = train_on_ranks(2, json);
  for (const std::string& error : run.errors) {
    EXPECT_NE(error.find("zero_optimization.stage3_max_live_parameters = 50000 is too small"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find(cat("at least ", 2 * dp_layer_params())), std::string::npos) << error;
  }
  EXPECT_FALSE(fs::exists(dir_ / "small" / "checkpoints"));
}

TEST_F(DataParallelTraining, AnySplitOfTheGlobalBatchOverRanksAndMicroBatchesGivesTheSameBits) {
  TrainOptions options;
  options.save_checkpoints = false;
  // Stages 2 and 3 reduce every micro-batch (micro-major), 0 and 1 sum a rank's first
  // (rank-major): the same tree when ranks and micro-batches are powers of two.
  for (int stage : {0, 2, 3}) {
    // 4 micro-batches per step: one rank accumulating 4, 2 x 2, 4 x 1.
    const RankResults one = train_on_ranks(1, dp_config(data(), dir_ / "a", stage, 4), options);
    expect_ranks_agree(one, "1 x 4");
    for (auto [world, accum] : {std::pair{2, 2}, std::pair{4, 1}}) {
      const std::string what = cat("stage ", stage, ", ", world, " ranks x ", accum);
      const RankResults split =
          train_on_ranks(world, dp_config(data(), dir_ / "b", stage, accum), options);
      expect_ranks_agree(split, what);
      EXPECT_EQ(split.by_rank[0].state_digest, one.by_rank[0].state_digest) << what;
      EXPECT_EQ(losses(split.by_rank[0]), losses(one.by_rank[0])) << what;
    }
  }
  // A world size that is no power of two: 3 ranks equal one rank accumulating 3.
  const RankResults one = train_on_ranks(1, dp_config(data(), dir_ / "c", 1, 3), options);
  const RankResults three = train_on_ranks(3, dp_config(data(), dir_ / "d", 1, 1), options);
  expect_ranks_agree(three, "3 x 1");
  EXPECT_EQ(three.by_rank[0].state_digest, one.by_rank[0].state_digest);
  EXPECT_EQ(losses(three.by_rank[0]), losses(one.by_rank[0]));
  // And the runs differ from a run on another global batch (the test can fail).
  const RankResults two = train_on_ranks(1, dp_config(data(), dir_ / "e", 1, 2), options);
  EXPECT_NE(two.by_rank[0].state_digest, one.by_rank[0].state_digest);
}

// With a loss mask (instruction tuning) the step's loss is the mean over every counted
// target of the global batch, each micro-batch weighed by its count: still one rank
// accumulating 4 micro-batches, 2 x 2 and 4 x 1 give the same bits, and the mask changes
// the run. The mask counts some windows wholly, some not at all, the rest in part.
TEST_F(DataParallelTraining, ALossMaskKeepsEverySplitOfTheGlobalBatchBitExact) {
  TrainOptions options;
  options.save_checkpoints = false;
  const std::string text = read_file_text(data().string());
  std::vector<int32_t> tokens(text.begin(), text.end());
  for (int32_t& t : tokens) t = static_cast<uint8_t>(t);
  write_token_shard(dir_ / "masked.bin", tokens, ShardTokenType::kUint16);
  std::vector<uint8_t> mask(tokens.size());
  for (size_t i = 0; i < mask.size(); i++) mask[i] = (i / 37) % 3 == 0 ? 0 : (i % 5 != 0);
  write_loss_mask(loss_mask_path_for(dir_ / "masked.bin"), mask);
  auto config = [&](const std::string& out, int stage, int accum, bool masked) {
    return dp_config(masked ? dir_ / "masked.bin" : data(), dir_ / out, stage, accum);
  };
  for (int stage : {0, 2}) {
    const RankResults one = train_on_ranks(1, config("m1", stage, 4, true), options);
    expect_ranks_agree(one, "1 x 4");
    ASSERT_GT(one.by_rank[0].steps.size(), 0u);
    EXPECT_GT(one.by_rank[0].steps[0].counted_targets, 0);
    EXPECT_LT(one.by_rank[0].steps[0].counted_targets, 4 * 4 * 16);
    for (auto [world, accum] : {std::pair{2, 2}, std::pair{4, 1}}) {
      const std::string what = cat("stage ", stage, ", ", world, " ranks x ", accum);
      const RankResults split = train_on_ranks(world, config("m2", stage, accum, true), options);
      expect_ranks_agree(split, what);
      EXPECT_EQ(split.by_rank[0].state_digest, one.by_rank[0].state_digest) << what;
      EXPECT_EQ(losses(split.by_rank[0]), losses(one.by_rank[0])) << what;
    }
    const RankResults unmasked = train_on_ranks(1, config("u", stage, 4, false), options);
    EXPECT_NE(unmasked.by_rank[0].state_digest, one.by_rank[0].state_digest);
    EXPECT_EQ(unmasked.by_rank[0].steps[0].counted_targets, -1);
  }
}

// bf16 gradients are summed over ranks as they are over micro-batches, every addition
// rounded to bf16: the stages agree, and so do the splits of a global batch of 4
// micro-batches over 1, 2 and 4 ranks.
TEST_F(DataParallelTraining, Bf16GivesTheSameBitsForEveryStageAndSplit) {
  TrainOptions options;
  options.save_checkpoints = false;
  std::string reference;
  std::vector<float> reference_losses;
  struct Split {
    int world, accum, stage;
  };
  for (Split split : {Split{1, 4, 0}, Split{2, 2, 0}, Split{2, 2, 1}, Split{2, 2, 2},
                      Split{4, 1, 2}, Split{2, 2, 3}, Split{4, 1, 3}}) {
    nlohmann::json json = dp_config(data(), dir_ / "bf16", split.stage, split.accum);
    json["bf16"] = {{"enabled", true}};
    json["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 2}};
    const std::string what =
        cat("bf16, ", split.world, " ranks x ", split.accum, ", stage ", split.stage);
    const RankResults run = train_on_ranks(split.world, json, options);
    expect_ranks_agree(run, what);
    if (reference.empty()) {
      reference = run.by_rank[0].state_digest;
      reference_losses = losses(run.by_rank[0]);
    }
    EXPECT_EQ(run.by_rank[0].state_digest, reference) << what;
    EXPECT_EQ(losses(run.by_rank[0]), reference_losses) << what;
  }
}

TEST_F(DataParallelTraining, ResumingOnAnotherWorldSizeAndStageIsBitExact) {
  // 20 steps on 4 ranks (stage 2) = 10 steps on 4 ranks (stage 3) + resume on 2 ranks
  // accumulating 2 (stage 1) + 10 steps: the same global batch, cut differently.
  nlohmann::json straight_json = dp_config(data(), dir_ / "straight", 2, 1);
  straight_json["train"]["steps"] = 20;
  straight_json["train"]["eval_interval"] = 10;
  const RankResults straight = train_on_ranks(4, straight_json);
  expect_ranks_agree(straight, "straight");

  nlohmann::json first_json = dp_config(data(), dir_ / "split", 3, 1);
  first_json["train"]["steps"] = 20;
  first_json["train"]["eval_interval"] = 10;
  first_json["zero_optimization"]["stage3_param_persistence_threshold"] = 1000;
  TrainOptions first;
  first.stop_at_step = 10;
  const RankResults half = train_on_ranks(4, first_json, first);
  expect_ranks_agree(half, "first half");
  nlohmann::json second_json = dp_config(data(), dir_ / "split", 1, 2);
  second_json["train"]["steps"] = 20;
  second_json["train"]["eval_interval"] = 10;
  TrainOptions second;
  second.resume = dir_ / "split";
  const RankResults resumed = train_on_ranks(2, second_json, second);
  expect_ranks_agree(resumed, "resumed");
  ASSERT_EQ(resumed.by_rank[0].steps_done, 20);
  EXPECT_EQ(resumed.by_rank[0].last_val_loss, straight.by_rank[0].last_val_loss);

  EXPECT_EQ(resumed.by_rank[0].state_digest, straight.by_rank[0].state_digest);
  const fs::path a = straight.by_rank[0].last_checkpoint, b = resumed.by_rank[0].last_checkpoint;
  EXPECT_EQ(read_file_bytes(a / "model.safetensors"), read_file_bytes(b / "model.safetensors"));
  // The moments are sharded by the world size that wrote them: 4 shards, then 2.
  const nlohmann::json shards_a = checkpoint_manifest(a)["optimizer_shards"];
  const nlohmann::json shards_b = checkpoint_manifest(b)["optimizer_shards"];
  EXPECT_EQ(shards_a["world_size"], 4);
  EXPECT_EQ(shards_a["shards"].size(), 4u);
  EXPECT_EQ(shards_b["world_size"], 2);
  EXPECT_EQ(shards_b["zero_stage"], 1);
  const fs::path mid = dir_ / "split" / "checkpoints" / "step_00000010";
  ASSERT_TRUE(fs::exists(mid));
  EXPECT_EQ(checkpoint_manifest(mid)["optimizer_shards"]["zero_stage"], 3);
  EXPECT_FALSE(fs::exists(a / "optimizer.safetensors"));
  const TrainingState sa = load_training_checkpoint(a), sb = load_training_checkpoint(b);
  EXPECT_TRUE(same_bits(sa.optimizer_array("exp_avg"), sb.optimizer_array("exp_avg")));
  EXPECT_TRUE(same_bits(sa.optimizer_array("exp_avg_sq"), sb.optimizer_array("exp_avg_sq")));
  EXPECT_TRUE(same_bits(sa.params, sb.params));
  // A rank's part alone: the moments inside its range, zeros outside.
  const ParamRange part{40000, 70000};
  const TrainingState partial = load_training_checkpoint(a, {.keep = part});
  const std::vector<float>& m = partial.optimizer_array("exp_avg");
  for (size_t i : {size_t{0}, part.begin - 1, part.end, m.size() - 1}) EXPECT_EQ(m[i], 0.0f) << i;
  for (size_t i = part.begin; i < part.end; i++)
    ASSERT_EQ(m[i], sa.optimizer_array("exp_avg")[i]) << i;
  // Only rank 0 writes checkpoints.
  EXPECT_TRUE(resumed.by_rank[1].last_checkpoint.empty());
}

TEST_F(DataParallelTraining, EachRankMovesAboutTwoModelSizesPerStep) {
  TrainOptions options;
  options.save_checkpoints = false;
  const int world = 4;
  for (int stage : {0, 1, 2}) {
    const RankResults run = train_on_ranks(world, dp_config(data(), dir_ / "t", stage, 1), options);
    expect_ranks_agree(run, cat("stage ", stage));
    const auto P = static_cast<double>(
        parse_train_config(dp_config(data(), dir_ / "p", 0, 1)).model.num_parameters());
    const ZeroPartition partition(static_cast<size_t>(P), world);
    // Stage 0: a ring all-reduce of the fp32 gradients; 1 and 2: a reduce-scatter of them
    // and an all-gather of the padded fp32 working parameters.
    const double expected =
        stage == 0 ? 2.0 * (world - 1) / world * P * 4
                   : (world - 1.0) / world * P * 4 + (world - 1.0) * partition.partition_size() * 4;
    for (int r = 0; r < world; r++) {
      for (const StepRecord& step : run.by_rank[r].steps) {
        EXPECT_NEAR(static_cast<double>(step.comm_bytes_sent), expected, 0.02 * expected)
            << "stage " << stage << ", rank " << r << ", step " << step.step;
        EXPECT_NEAR(static_cast<double>(step.comm_bytes_received), expected, 0.02 * expected);
      }
    }
  }
}

// The planner's traffic model (zero/zero_traffic.h) is what the ranks move: per stage, with
// one and two micro-batches per step (stage 2 reduces each, stages 0 and 1 once), fp32 and
// bf16 (half the bytes of gradients and working parameters).
TEST_F(DataParallelTraining, TheTrafficModelIsWhatEachRankSends) {
  TrainOptions options;
  options.save_checkpoints = false;
  const int world = 4;
  struct Case {
    int stage, accum;
    bool bf16;
  };
  for (const Case c : {Case{0, 2, false}, Case{1, 2, false}, Case{2, 1, false}, Case{2, 2, false},
                       Case{2, 2, true}}) {
    nlohmann::json json = dp_config(data(), dir_ / "traffic", c.stage, c.accum);
    json["train"]["steps"] = 2;
    json["bf16"] = {{"enabled", c.bf16}};
    const RankResults run = train_on_ranks(world, json, options);
    const TrainConfig config = parse_train_config(json);
    const size_t bytes = c.bf16 ? 2 : 4;
    const double expected =
        zero_step_traffic(c.stage, config.model.num_parameters(), world, bytes, bytes)
            .total(c.accum);
    const std::string what =
        cat("stage ", c.stage, ", ", c.accum, " micro-batches", c.bf16 ? ", bf16" : "");
    for (int r = 0; r < world; r++)
      for (const StepRecord& step : run.by_rank[r].steps)
        EXPECT_NEAR(static_cast<double>(step.comm_bytes_sent), expected, 0.02 * expected)
            << what << ", rank " << r << ", step " << step.step;
  }
}

// Stage 3 adds the parameter gathers of forward and backward to the reduction: about 3P
// elements per rank and step where stages 1 and 2 move 2P (ZeRO's volumes). Here with a
// live buffer of two layers, so that no block stays cached from one use to the next but
// the tied embeddings between the end of forward and the start of backward. A gather is
// each owner broadcasting its piece: a rank receives the blocks it does not own.
TEST_F(DataParallelTraining, Stage3MovesAboutThreeModelSizesPerStep) {
  TrainOptions options;
  options.save_checkpoints = false;
  const int world = 4;
  nlohmann::json json = dp_config(data(), dir_ / "t3", 3, 1);
  json["zero_optimization"]["stage3_param_persistence_threshold"] = 1000;
  json["zero_optimization"]["stage3_max_live_parameters"] = 2 * dp_layer_params();
  json["zero_optimization"]["stage3_prefetch_bucket_size"] = 0;
  const RankResults run = train_on_ranks(world, json, options);
  expect_ranks_agree(run, "stage 3");
  const auto P = static_cast<double>(parse_train_config(json).model.num_parameters());
  const double ring = (world - 1.0) / world * P * 4;  // (N - 1) / N of the fp32 model
  const auto steps = run.by_rank[0].steps.size();
  for (size_t s = 0; s < steps; s++) {
    // The mean over the ranks: which rank owns which block decides what each receives.
    double received = 0, sent = 0;
    for (int r = 0; r < world; r++) {
      received += static_cast<double>(run.by_rank[r].steps[s].comm_bytes_received) / world;
      sent += static_cast<double>(run.by_rank[r].steps[s].comm_bytes_sent) / world;
    }
    // The reduction (1 ring volume) and the gathers: the whole model in forward, all but
    // the cached embeddings and ln_f (persistent) in backward, ~2.5 ring volumes here.
    EXPECT_GT(received, 2.4 * ring) << "step " << s;
    EXPECT_LT(received, 3.0 * ring) << "step " << s;
    // A broadcast is counted once at its root, so the ranks send less than they receive.
    EXPECT_GT(sent, ring) << "step " << s;
    EXPECT_LT(sent, received) << "step " << s;
  }
}

TEST_F(DataParallelTraining, MetricsCarryPerRankFiguresWhereTheyDiffer) {
  nlohmann::json json = dp_config(data(), dir_ / "m", 1, 1);
  json["offload_optimizer"] = {{"schedule", "cpu"}};
  json["train"]["steps"] = 2;
  TrainOptions options;
  options.save_checkpoints = false;
  options.metrics_path = dir_ / "metrics.jsonl";
  expect_ranks_agree(train_on_ranks(3, json, options), "metrics");
  std::ifstream in(options.metrics_path);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.contains("loss")) continue;
    steps++;
    ASSERT_TRUE(record.contains("ranks")) << line;
    const nlohmann::json& ranks = record["ranks"];
    // The last rank's partition is the smallest: fewer working parameters go back to the
    // device after its CPU updates.
    ASSERT_TRUE(ranks.contains("h2d_bytes")) << line;
    ASSERT_EQ(ranks["h2d_bytes"].size(), 3u);
    EXPECT_EQ(ranks["h2d_bytes"][0], record["h2d_bytes"]);
    EXPECT_LT(ranks["h2d_bytes"][2].get<double>(), ranks["h2d_bytes"][0].get<double>());
    // Every rank moves the same bytes through the communicator: not listed.
    EXPECT_FALSE(ranks.contains("comm_bytes_sent")) << line;
  }
  EXPECT_EQ(steps, 2);
}

TEST_F(DataParallelTraining, RanksWithDifferentConfigsAreRefusedNamingTheKey) {
  const TrainConfig a = parse_train_config(dp_config(data(), dir_ / "x", 1, 1));
  nlohmann::json other = dp_config(data(), dir_ / "x", 1, 1);
  other["optimizer"]["params"]["lr"] = 1e-2;
  const TrainConfig b = parse_train_config(other);
  std::vector<std::string> errors(2), messages(2);
  std::vector<int> own(2, -1);
  TrainOptions options;
  options.show_progress = false;
  run_local_ranks(2, [&](Communicator& comm) {
    // Every rank stops in step (a clean finalize under mpirun, no abort).
    try {
      train(comm.rank() == 0 ? a : b, options, comm);
    } catch (const ErrorOnEveryRank& e) {
      errors[comm.rank()] = e.what();
      messages[comm.rank()] = e.message();
      own[comm.rank()] = e.own() ? 1 : 0;
    }
  });
  // what() names the rank once, before the message; message() is the rank's text alone.
  for (int rank : {0, 1}) {
    EXPECT_EQ(errors[rank], cat("rank ", rank, " of 2: ", messages[rank])) << rank;
    EXPECT_EQ(messages[rank].find("rank " + std::to_string(rank) + " of 2"), std::string::npos);
  }
  EXPECT_EQ(own[1], 1);
  EXPECT_NE(errors[1].find("rank 1 of 2"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("optimizer.params.lr"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 0 of 2"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("another rank"), std::string::npos) << errors[0];
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x" / "checkpoints"));
}

// Several ranks on the cuda device run over NCCL, which needs a GPU per rank: here (no GPU)
// every rank stops with one line saying so, before anything is allocated.
TEST_F(DataParallelTraining, NcclWithoutAGpuIsAOneLineErrorOnEveryRank) {
  nlohmann::json json = dp_config(data(), dir_ / "cuda", 1, 1);
  json["device"] = {{"type", "cuda"}};
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU (DataParallelGpu runs)";
  const RankResults run = train_on_ranks(2, json);
  for (const std::string& error : run.errors) {
    EXPECT_TRUE(error.find("NCCL needs a GPU per rank") != std::string::npos ||
                error.find("built without NCCL") != std::string::npos)
        << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  EXPECT_FALSE(fs::exists(dir_ / "cuda" / "checkpoints"));
}

// Model states per rank (mixed precision: bf16 working params and gradients, fp32 params,
// m, v) against ZeRO's formulas, within the partition padding: 16P at stage 0, 4P + 12P/N
// at stage 1, 2P + 14P/N at stage 2, 16P/N at stage 3. The buffers beside them (gradient
// slots, gathered parameters) are reported apart and bounded.
TEST_F(DataParallelTraining, ModelStateBytesPerRankFollowTheZeroFormulas) {
  const int world = 4;
  for (int stage : {0, 1, 2, 3}) {
    nlohmann::json json = dp_config(data(), dir_ / "plan", stage, 1);
    json["bf16"] = {{"enabled", true}};
    json["zero_optimization"]["stage3_param_persistence_threshold"] = 1000;
    json["zero_optimization"]["stage3_max_live_parameters"] = 2 * dp_layer_params();
    const TrainConfig config = parse_train_config(json);
    const auto P = static_cast<double>(config.model.num_parameters());
    const ZeroPartition partition(static_cast<size_t>(P), world);
    const auto S = static_cast<double>(partition.partition_size());
    const double padded = static_cast<double>(partition.padded_size());
    for (int rank = 0; rank < world; rank++) {
      auto device = make_training_device(config);
      ThreadPool pool;
      const TrainingMemoryPlan plan =
          plan_training(config, *device, pool, zero_state_range(config, world, rank), world);
      const auto bytes = static_cast<double>(plan.model_state_bytes());
      const auto mine = static_cast<double>(partition.range(rank).size());
      const std::string what = cat("stage ", stage, ", rank ", rank);
      // Within the padding: a rank holds S elements of each partitioned tensor, and at
      // stages 1 and 2 the working parameters fill world x S (bf16).
      const double formula[] = {16 * P, 4 * P + 12 * P / world, 2 * P + 14 * P / world,
                                16 * P / world};
      const double padding[] = {0, 2 * (padded - P) + 12 * (S - P / world),
                                2 * (padded - P) + 14 * (S - P / world), 16 * (S - P / world)};
      const double exact[] = {16 * P, 2 * padded + 2 * P + 12 * mine,
                              2 * padded + 2 * S + 12 * mine, 4 * S + 12 * mine};
      EXPECT_LE(bytes, formula[stage] + padding[stage]) << what;
      EXPECT_EQ(bytes, exact[stage]) << what;
      EXPECT_EQ(plan.offload.partition, zero_state_range(config, world, rank)) << what;
      // Buffers: the gradient slots from stage 2 (the two largest blocks: the two layers; the
      // embeddings have 256 x 64 + 16 x 64), and at stage 3 the live buffer (two layers)
      // and the persistent ln_f.
      // With overlap_comm (on by default) a third slot lets a layer's reduction run while
      // the next layer's backward fills another.
      const double layer = static_cast<double>(dp_layer_params());
      ASSERT_TRUE(config.zero.overlap_comm);
      const double buffers[] = {0, 0, 2 * 3 * layer, 2 * (3 * layer + 2 * layer + 2 * 64)};
      EXPECT_EQ(static_cast<double>(plan.zero_buffer_bytes), buffers[stage]) << what;
      EXPECT_GE(plan.total.device, plan.model_bytes + plan.zero_buffer_bytes) << what;
    }
  }
}

// Records the named points of each step (core/step_hooks.h) as one rank sees them.
class RecordingHooks final : public StepHooks {
 public:
  void gradients_final(size_t begin, size_t end) override {
    events.push_back(cat("final ", begin, " ", end));
    covered += end - begin;
  }
  void before_update(int64_t step) override {
    events.push_back(cat("before ", step, " covered ", covered));
    covered = 0;
  }
  void after_update(int64_t step) override { events.push_back(cat("after ", step)); }
  std::vector<std::string> events;
  size_t covered = 0;
};

TEST_F(DataParallelTraining, HooksSeeEveryGradientOnceThenBeforeAndAfterEachUpdate) {
  nlohmann::json json = dp_config(data(), dir_ / "hooks", 2, 2);
  json["train"]["steps"] = 3;
  const TrainConfig config = parse_train_config(json);
  const size_t P = static_cast<size_t>(config.model.num_parameters());
  std::vector<RecordingHooks> hooks(2);
  run_local_ranks(2, [&](Communicator& comm) {
    TrainOptions options;
    options.show_progress = false;
    options.save_checkpoints = false;
    options.hooks = {&hooks[comm.rank()]};
    train(config, options, comm);
  });
  for (const RecordingHooks& h : hooks) {
    std::vector<std::string> points;  // the events without the ranges
    for (const std::string& e : h.events)
      if (e.rfind("final", 0) != 0) points.push_back(e);
    const std::string all = cat(P);
    EXPECT_EQ(points, (std::vector<std::string>{"before 1 covered " + all, "after 1",
                                                "before 2 covered " + all, "after 2",
                                                "before 3 covered " + all, "after 3"}));
    // Several ranges per step, during backward: ln_f, every block, the embeddings.
    EXPECT_GE(h.events.size(), 3u * (2 + config.model.n_layer + 2));
  }
}

TEST(ZeroPartition, CpuBlockSumsOfSquaresComposeToTheSumAndToAPartitionsOwn) {
  const auto cpu = make_cpu_backend();
  testing::check_block_sums<float>(*cpu);
  testing::check_block_sums<Bf16>(*cpu);
}

TEST(ZeroPartition, EqualAlignedPartitionsCoverTheParametersOnce) {
  for (size_t P : {size_t{1}, size_t{16384}, size_t{118'000}, size_t{1'000'003}}) {
    for (int world : {1, 2, 3, 4, 7}) {
      const ZeroPartition partition(P, world);
      EXPECT_EQ(partition.partition_size() % ZeroPartition::kPartitionAlignment, 0u);
      EXPECT_GE(partition.padded_size(), P);
      EXPECT_LT(partition.padded_size() - P,
                world * ZeroPartition::kPartitionAlignment + partition.partition_size());
      size_t next = 0;
      for (int r = 0; r < world; r++) {
        const ParamRange range = partition.range(r);
        EXPECT_EQ(range.begin, next) << P << " over " << world;
        EXPECT_LE(range.size(), partition.partition_size());
        if (range.size() > 0) {
          EXPECT_EQ(partition.owner(range.begin), r);
          EXPECT_EQ(partition.owner(range.end - 1), r);
        }
        next = range.end;
      }
      EXPECT_EQ(next, P);
    }
  }
}

TEST(ZeroPartition, EachRankCutsItsOwnPartitionIntoSubgroups) {
  const ZeroPartition partition(100'000, 3);
  const ParamRange mine = partition.range(1);
  const OffloadPlan plan = make_offload_plan(
      {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 7000, .stride = 2}, 100'000,
      mine);
  ASSERT_FALSE(plan.subgroups.empty());
  EXPECT_EQ(plan.subgroups.front().begin, mine.begin);
  EXPECT_EQ(plan.subgroups.back().end, mine.end);
  for (size_t i = 0; i < plan.subgroups.size(); i++) {
    // The interleave pattern restarts in every partition.
    const UpdateSite want = (i + 1) % 2 == 0 ? UpdateSite::kDeviceStaged : UpdateSite::kHost;
    EXPECT_EQ(plan.subgroups[i].site, want) << i;
    if (i > 0) {
      EXPECT_EQ(plan.subgroups[i].begin, plan.subgroups[i - 1].end);
    }
  }
}

// The accumulator's streaming order is the communicators' tree order: A micro-batches
// accumulated give the bits of tree_sum over A parts, for every A, with the last
// micro-batch finished range by range.
TEST(GradientAccumulator, SumsMicroBatchesInTheCommunicatorsTreeOrder) {
  const auto backend = make_cpu_backend();
  const size_t n = 1000;
  for (int A = 1; A <= 11; A++) {
    std::vector<std::vector<float>> leaves;
    for (int a = 0; a < A; a++) {
      // Magnitudes far apart, so that the order of the additions shows in the bits.
      std::vector<float> leaf = testing::randn(n, 100 + a, a % 3 == 0 ? 1e6f : 1e-2f);
      leaves.push_back(leaf);
    }
    GradientAccumulator accumulator(*backend, StorageDType::kF32, n, A);
    EXPECT_LE(accumulator.allocated_bytes(),
              n * 4 * static_cast<size_t>(std::bit_width(static_cast<unsigned>(A))));
    Buffer grads = backend->allocate(n * sizeof(float));
    for (int step = 0; step < 2; step++) {  // the second step reuses the buffers
      accumulator.start_step();
      for (int a = 0; a < A; a++) {
        backend->copy_from_host(grads.as<void>(), leaves[a].data(), n * sizeof(float));
        if (a + 1 < A) {
          accumulator.add(grads.as<void>());
        } else {
          accumulator.finish(grads.as<void>(), 600, n);
          accumulator.finish(grads.as<void>(), 0, 600);
        }
      }
      std::vector<const float*> parts;
      for (const auto& leaf : leaves) parts.push_back(leaf.data());
      std::vector<float> want(n);
      tree_sum(parts.data(), A, n, want.data());
      EXPECT_TRUE(same_bits(std::vector<float>(grads.as<float>(), grads.as<float>() + n), want))
          << A << " micro-batches, step " << step;
    }
  }
}

}  // namespace
}  // namespace tandem
