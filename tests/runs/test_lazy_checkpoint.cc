// Lazy checkpoints (ckpt/checkpointer.h): the snapshot taken while the next step runs
// holds the same bits as a synchronous save, under every schedule; resuming from one is
// bit-exact; train.keep_checkpoints removes only older committed checkpoints; a write that
// fails (the file-size limit standing in for a full disk) names the path and the bytes,
// leaves the previous checkpoint as `latest`, and stops or continues as
// train.checkpoint_failure says.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/config/memory_plan.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/thread_pool.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

// Every file of two checkpoints, byte for byte, but the run config in trainer_state.json
// (which names the run's own directory and checkpoint mode).
void expect_same_checkpoint(const fs::path& a, const fs::path& b, const std::string& what) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file_bytes(a / file), read_file_bytes(b / file)) << what << ": " << file;
  const TrainingState sa = load_training_checkpoint(a), sb = load_training_checkpoint(b);
  EXPECT_EQ(sa.step, sb.step) << what;
  EXPECT_EQ(sa.train_position, sb.train_position) << what;
  EXPECT_EQ(sa.sample_rng, sb.sample_rng) << what;
}

TEST(LazyCheckpoints, HoldTheBitsOfSynchronousOnesUnderEverySchedule) {
  testing::ScratchDir dir("lazy_bits");
  testing::write_small_corpus(dir / "data.txt");
  struct Case {
    const char* schedule;
    double ratio;
  };
  for (const Case& c :
       {Case{"device", 0.5}, Case{"cpu", 0.5}, Case{"ratio", 0.5}, Case{"interleave", 0.5}}) {
    std::vector<TrainResult> results;
    for (bool lazy : {true, false}) {
      nlohmann::json json = testing::tiny_run_config(
          dir / "data.txt", dir / cat(c.schedule, lazy ? "_lazy" : "_sync"));
      json["train"]["steps"] = 9;
      json["train"]["checkpoint_interval"] = 3;
      json["train"]["lazy_checkpoints"] = lazy;
      json["zero_optimization"] = {{"sub_group_size", 1000}};
      json["offload_optimizer"] = {{"schedule", c.schedule}, {"ratio", c.ratio}, {"stride", 2}};
      results.push_back(train(parse_train_config(json), testing::quiet()));
    }
    const TrainResult &lazy = results[0], &sync = results[1];
    ASSERT_EQ(lazy.checkpoints.size(), 3u) << c.schedule;
    ASSERT_EQ(sync.checkpoints.size(), 3u) << c.schedule;
    for (size_t k = 0; k < 3; k++) {
      const CheckpointRecord &a = lazy.checkpoints[k], &b = sync.checkpoints[k];
      EXPECT_EQ(a.step, static_cast<int64_t>(3 * (k + 1)));
      EXPECT_TRUE(a.error.empty()) << a.error;
      // The last checkpoint of a run has no next step to hide behind.
      EXPECT_EQ(a.lazy, k < 2) << c.schedule << " checkpoint " << k;
      EXPECT_FALSE(b.lazy);
      EXPECT_GE(a.flush_ms, 0.0);
      expect_same_checkpoint(a.path, b.path, cat(c.schedule, " step ", a.step));
    }
    EXPECT_EQ(lazy.state_digest, sync.state_digest) << c.schedule;
  }
}

TEST(LazyCheckpoints, ResumeFromALazyCheckpointIsBitExact) {
  testing::ScratchDir dir("lazy_resume");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "straight");
  json["train"]["checkpoint_interval"] = 5;
  const TrainResult straight = train(parse_train_config(json), testing::quiet());
  ASSERT_EQ(straight.checkpoints.size(), 4u);
  ASSERT_TRUE(straight.checkpoints[1].lazy);
  const fs::path step10 = straight.checkpoints[1].path;

  json["train"]["output_dir"] = (dir / "resumed").string();
  TrainOptions resume = testing::quiet();
  resume.resume = step10;
  const TrainResult resumed = train(parse_train_config(json), resume);
  EXPECT_EQ(resumed.steps_done, 20);
  expect_same_checkpoint(straight.last_checkpoint, resumed.last_checkpoint, "step 20");
  EXPECT_EQ(straight.state_digest, resumed.state_digest);
}

TEST(LazyCheckpoints, KeepCheckpointsRemovesOnlyOlderCommittedOnes) {
  testing::ScratchDir dir("keep");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["steps"] = 12;
  json["train"]["checkpoint_interval"] = 2;
  json["train"]["keep_checkpoints"] = 2;
  const TrainResult result = train(parse_train_config(json), testing::quiet());
  EXPECT_EQ(result.checkpoints.size(), 6u);
  EXPECT_EQ(testing::entries(dir / "run" / "checkpoints"),
            (std::set<std::string>{"latest", "step_00000010", "step_00000012"}));
  EXPECT_EQ(resolve_checkpoint(dir / "run"), dir / "run" / "checkpoints" / "step_00000012");
}

// The data-parallel cases of the several-rank tests: every ZeRO stage, and DeMo.
struct RankCase {
  std::string name;
  int stage;
  bool demo;
};
const RankCase kRankCases[] = {{"stage0", 0, false},
                               {"stage1", 1, false},
                               {"stage2", 2, false},
                               {"stage3", 3, false},
                               {"demo", 0, true}};

// A 2-rank run of `c` (model width `n_embd`, subgroups of `sub_group_size`) in dir/name.
nlohmann::json rank_case_config(const testing::ScratchDir& dir, const RankCase& c,
                                const std::string& name, int n_embd, int sub_group_size) {
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / name);
  json["model"]["n_embd"] = n_embd;
  json["gradient_accumulation_steps"] = 1;
  json["zero_optimization"] = {{"stage", c.stage}, {"sub_group_size", sub_group_size}};
  if (c.demo)
    json["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 3e-3}, {"compression_topk", 8}}}};
  json["train"]["eval_interval"] = 0;
  return json;
}

// Rank 0's checkpoints of two runs: all but the last lazy, committed, verifying, and the
// same files byte for byte but trainer_state.json (which names the run's own directory:
// its record of the run's data and ranks is compared instead) and so manifest.json.
void expect_same_rank_checkpoints(const std::vector<CheckpointRecord>& records,
                                  const std::vector<CheckpointRecord>& reference,
                                  const std::string& what) {
  ASSERT_EQ(records.size(), reference.size()) << what;
  for (size_t k = 0; k < records.size(); k++) {
    const CheckpointRecord &a = records[k], &b = reference[k];
    EXPECT_EQ(a.lazy, k + 1 < records.size()) << what;
    ASSERT_TRUE(a.error.empty()) << a.error;
    ASSERT_FALSE(a.path.empty()) << what;
    verify_checkpoint(a.path);
    std::set<std::string> files = testing::entries(a.path);
    EXPECT_EQ(files, testing::entries(b.path)) << what;
    // trainer_state.json names the run's own directory; what it records of the run is the same.
    const auto run_record = [](const fs::path& dir) {
      return nlohmann::json::parse(read_file_text(dir / "trainer_state.json")).at("run");
    };
    EXPECT_EQ(run_record(a.path), run_record(b.path)) << what << " step " << a.step;
    files.erase("trainer_state.json");
    files.erase("manifest.json");
    for (const std::string& file : files)
      EXPECT_EQ(read_file_bytes(a.path / file), read_file_bytes(b.path / file))
          << what << " step " << a.step << ": " << file;
  }
}

// Several ranks: each rank writes its files in the background into rank 0's staging
// directory, and rank 0 commits once every rank's are durable. Every ZeRO stage and DeMo
// (each rank's own momentum), on 2 ranks: the same files as synchronous checkpoints, and a
// run resumed from a lazy checkpoint (on 2 ranks, and at stage 2 on 1) ends with the bits of
// one that was not interrupted.
TEST(LazyCheckpoints, SeveralRanksWriteTheBitsOfSynchronousCheckpoints) {
  testing::ScratchDir dir("lazy_ranks");
  testing::write_small_corpus(dir / "data.txt");
  for (const RankCase& c : kRankCases) {
    const auto config = [&](bool lazy, const std::string& tag) {
      nlohmann::json json = rank_case_config(dir, c, c.name + tag, 32, 3000);
      json["train"]["steps"] = 8;
      json["train"]["checkpoint_interval"] = 3;
      json["train"]["lazy_checkpoints"] = lazy;
      return json;
    };
    const testing::RankResults lazy = testing::train_on_ranks(2, config(true, "_lazy"));
    const testing::RankResults sync = testing::train_on_ranks(2, config(false, "_sync"));
    testing::expect_ranks_agree(lazy, c.name + " lazy");
    testing::expect_ranks_agree(sync, c.name + " sync");
    EXPECT_EQ(lazy.by_rank[0].state_digest, sync.by_rank[0].state_digest) << c.name;
    const std::vector<CheckpointRecord>& records = lazy.by_rank[0].checkpoints;
    ASSERT_EQ(records.size(), 3u) << c.name;  // steps 3 and 6 lazy, 8 synchronous
    expect_same_rank_checkpoints(records, sync.by_rank[0].checkpoints, c.name);
    // Resume from the lazy checkpoint of step 6.
    TrainOptions resume;
    resume.resume = records[1].path;
    const testing::RankResults resumed =
        testing::train_on_ranks(2, config(true, "_resumed"), resume);
    testing::expect_ranks_agree(resumed, c.name + " resumed");
    EXPECT_EQ(resumed.by_rank[0].state_digest, sync.by_rank[0].state_digest) << c.name;
  }
}

TEST(LazyCheckpoints, AFailedWriteKeepsThePreviousCheckpointAndStopsOrContinues) {
  testing::ScratchDir dir("ckpt_failure");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["checkpoint_interval"] = 5;
  TrainOptions first = testing::quiet();
  first.stop_at_step = 10;
  train(parse_train_config(json), first);
  const fs::path root = dir / "run" / "checkpoints";
  ASSERT_EQ(resolve_checkpoint(root), root / "step_00000010");
  const uint64_t model_bytes = fs::file_size(root / "step_00000010" / "model.safetensors");

  for (const char* policy : {"stop", "continue"}) {
    json["train"]["checkpoint_failure"] = policy;
    TrainOptions resume = testing::quiet();
    resume.resume = dir / "run";
    std::string error;
    TrainResult result;
    {
      // The weights file fits, the optimizer's (twice its size) does not.
      const testing::FileSizeLimit limit(model_bytes + 4096);
      try {
        result = train(parse_train_config(json), resume);
      } catch (const Error& e) {
        error = e.what();
      }
    }
    if (std::string(policy) == "stop") {
      // The lazy checkpoint of step 15 failed in the background; the loop stopped on it.
      EXPECT_CONTAINS(error, "the checkpoint of step 15 failed: ");
      EXPECT_CONTAINS(error, "optimizer.safetensors");
      EXPECT_CONTAINS(error, "; it needs about ");
      EXPECT_CONTAINS(error,
                      "the previous checkpoint, step_00000010, is intact and 'latest' "
                      "still names it");
      std::printf("[ note ] the error: %s\n", error.c_str());
    } else {
      // Trained on past the failure at 15 to step 20, whose synchronous checkpoint failed
      // too: the run ends in an error that says what is lost, not as a finished run.
      EXPECT_CONTAINS(error,
                      "the run's last checkpoint (step 20) failed: steps 11-20 exist "
                      "nowhere on disk; the newest checkpoint is " +
                          (root / "step_00000010").string());
      std::printf("[ note ] the error: %s\n", error.c_str());
    }
    // Nothing of the failed checkpoints is left, and `latest` still names step 10, intact.
    EXPECT_EQ(testing::entries(root),
              (std::set<std::string>{"latest", "step_00000005", "step_00000010"}))
        << policy;
    EXPECT_EQ(resolve_checkpoint(root), root / "step_00000010");
    verify_checkpoint(root / "step_00000010");
  }
}

// A run none of whose checkpoints could be written says so, and does not end as though
// it had finished: no earlier checkpoint is claimed intact, and the exit is an error.
TEST(LazyCheckpoints, ARunWithNoCheckpointOnDiskEndsInAnErrorSayingSo) {
  testing::ScratchDir dir("ckpt_none");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["checkpoint_interval"] = 5;
  json["train"]["checkpoint_failure"] = "continue";
  std::string error;
  {
    const testing::FileSizeLimit limit(4096);  // no checkpoint's weights fit
    error = testing::error_of([&] { train(parse_train_config(json), testing::quiet()); });
  }
  EXPECT_CONTAINS(error,
                  "the run's last checkpoint (step 20) failed: no checkpoint of this run "
                  "is on disk, so none of its 20 steps is");
  const fs::path root = dir / "run" / "checkpoints";
  EXPECT_FALSE(fs::exists(root / "latest"));
}

// When a full copy of the state does not fit the host memory a snapshot may take
// (train.checkpoint_memory_mb), checkpoints stream through a bounded pool of pinned slots
// (offload/snapshot_pool.h, ckpt/streamed_checkpoint.h): lazy ones and the synchronous last
// one hold the bits of full-copy checkpoints under each schedule, and the run's own bits
// are unchanged. A full disk fails the streamed checkpoint with the file named and leaves
// the previous one as `latest`.
TEST(LazyCheckpoints, StreamedThroughABoundedPoolTheyHoldTheSameBits) {
  testing::ScratchDir dir("streamed_pool");
  testing::write_small_corpus(dir / "data.txt");
  const auto config = [&](const std::string& name, int64_t memory_mb) {
    nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / name);
    json["model"]["n_embd"] = 96;  // 250k parameters: 3 MB of AdamW state
    json["train"]["steps"] = 6;
    json["train"]["eval_interval"] = 0;
    json["train"]["checkpoint_interval"] = 2;
    json["train"]["checkpoint_memory_mb"] = memory_mb;
    json["zero_optimization"] = {{"sub_group_size", 40000}};
    return json;
  };
  for (const char* schedule : {"cpu", "device", "interleave"}) {
    std::vector<TrainResult> results;
    for (const int64_t memory_mb : {1, 64}) {
      nlohmann::json json = config(cat(schedule, "_", memory_mb), memory_mb);
      json["offload_optimizer"] = {{"schedule", schedule}, {"stride", 2}};
      const TrainConfig parsed = parse_train_config(json);
      auto device = make_training_device(parsed);
      ThreadPool pool(1);
      const TrainingMemoryPlan plan = plan_training(parsed, *device, pool);
      // 1 MiB: 4 slots of 21845 parameters' state; 64 MiB: a full copy.
      EXPECT_EQ(plan.snapshot.streamed, memory_mb == 1) << schedule;
      if (memory_mb == 1) {
        EXPECT_EQ(plan.snapshot.pool_bytes(), 4u * 21845 * 12);
        EXPECT_EQ(plan.total.host, 0u);
        EXPECT_CONTAINS(plan.to_text(), "checkpoint snapshot: streamed through a pool of 4 x");
      }
      results.push_back(train(parsed, testing::quiet()));
    }
    const TrainResult &streamed = results[0], &full = results[1];
    ASSERT_EQ(streamed.checkpoints.size(), 3u) << schedule;
    for (size_t k = 0; k < 3; k++) {
      const CheckpointRecord &a = streamed.checkpoints[k], &b = full.checkpoints[k];
      ASSERT_TRUE(a.error.empty()) << a.error;
      EXPECT_EQ(a.lazy, k < 2) << schedule;
      verify_checkpoint(a.path);
      expect_same_checkpoint(a.path, b.path, cat(schedule, " step ", a.step));
    }
    EXPECT_EQ(streamed.state_digest, full.state_digest) << schedule;
  }

  // A full disk: the streamed checkpoint of step 4 cannot reserve its files.
  const fs::path root = dir / "full_disk" / "checkpoints";
  TrainOptions first = testing::quiet();
  first.stop_at_step = 2;
  train(parse_train_config(config("full_disk", 1)), first);
  ASSERT_EQ(resolve_checkpoint(root), root / "step_00000002");
  std::string error;
  {
    const testing::FileSizeLimit limit(fs::file_size(root / "step_00000002" / "model.safetensors") +
                                       4096);
    TrainOptions resume = testing::quiet();
    resume.resume = dir / "full_disk";
    try {
      train(parse_train_config(config("full_disk", 1)), resume);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  EXPECT_CONTAINS(error, "the checkpoint of step 4 failed: ");
  EXPECT_CONTAINS(error, "optimizer.safetensors: cannot reserve");
  EXPECT_EQ(testing::entries(root), (std::set<std::string>{"latest", "step_00000002"}));
  verify_checkpoint(root / "step_00000002");
}

// Several ranks stream too, each rank its pieces through a pool of its own into its files
// in rank 0's staging directory (its optimizer shard and, from ZeRO stage 1, its partition
// of the weights): every stage and DeMo, on 2 ranks, write the files of full-copy
// checkpoints byte for byte, lazy ones and the synchronous last one.
TEST(LazyCheckpoints, SeveralRanksStreamThroughPoolsOfTheirOwn) {
  testing::ScratchDir dir("streamed_ranks");
  testing::write_small_corpus(dir / "data.txt");
  for (const RankCase& c : kRankCases) {
    const auto config = [&](int64_t memory_mb) {
      nlohmann::json json = rank_case_config(dir, c, cat(c.name, "_", memory_mb), 96, 30000);
      json["train"]["steps"] = 5;
      json["train"]["checkpoint_interval"] = 2;
      json["train"]["checkpoint_memory_mb"] = memory_mb;
      return json;
    };
    const testing::RankResults streamed = testing::train_on_ranks(2, config(1));
    const testing::RankResults full = testing::train_on_ranks(2, config(64));
    testing::expect_ranks_agree(streamed, c.name + " streamed");
    testing::expect_ranks_agree(full, c.name + " full");
    EXPECT_EQ(streamed.by_rank[0].state_digest, full.by_rank[0].state_digest) << c.name;
    const std::vector<CheckpointRecord>& records = streamed.by_rank[0].checkpoints;
    ASSERT_EQ(records.size(), 3u) << c.name;  // steps 2 and 4 lazy, 5 synchronous
    expect_same_rank_checkpoints(records, full.by_rank[0].checkpoints, c.name);
  }
}

}  // namespace
}  // namespace tandem
