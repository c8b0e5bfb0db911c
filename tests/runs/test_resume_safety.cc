// Resuming never destroys or silently corrupts a run: `tandem train --resume RUN` goes on in
// RUN whatever the config's train.output_dir says, a resumed run refuses an output
// directory holding another run's checkpoints, a resume whose config or data differ in what
// the numbers depend on is refused naming each difference (unless --allow-inexact-resume),
// and resuming a finished run says so and writes nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/resume_check.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

// Every file under `dir`, with its bytes.
std::map<std::string, std::vector<uint8_t>> snapshot(const fs::path& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != ".tandem.lock")
      files[fs::relative(e.path(), dir).string()] = read_file_bytes(e.path());
  return files;
}

TEST(ResumeSafety, AResumedRunGoesOnInItsOwnDirectoryAndNeverAmongAnotherRunsCheckpoints) {
  testing::ScratchDir dir("resume_dirs");
  testing::write_small_corpus(dir / "data.txt");
  const std::string tandem = testing::tandem_binary().string();
  // Run A stops at step 2 of 4; run B, another run, lives in the config's output_dir.
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "A");
  json["train"]["steps"] = 4;
  write_file_atomic(dir / "a.json", json.dump());
  json["train"]["output_dir"] = (dir / "B").string();
  write_file_atomic(dir / "b.json", json.dump());
  auto run = [&](const std::string& args) {
    return testing::run_command(tandem + " train " + args + " </dev/null");
  };
  ASSERT_EQ(run("--config " + (dir / "a.json").string() + " --stop-at-step 2").exit_code, 0);
  ASSERT_EQ(run("--config " + (dir / "b.json").string() + " --stop-at-step 2").exit_code, 0);
  const auto b_before = snapshot(dir / "B");

  // b.json names B, but the resumed run A goes on in A.
  const testing::CommandResult resumed =
      run("--config " + (dir / "b.json").string() + " --resume " + (dir / "A").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "A" / "checkpoints" / "step_00000004"));
  EXPECT_EQ(snapshot(dir / "B"), b_before);

  // Told to write into B, which holds another run: refused, B untouched.
  const testing::CommandResult into_b =
      run("--config " + (dir / "a.json").string() +
          " --set train.steps=6 --set train.output_dir=" + (dir / "B").string() + " --resume " +
          (dir / "A" / "checkpoints" / "step_00000004").string());
  EXPECT_NE(into_b.exit_code, 0);
  EXPECT_CONTAINS(into_b.output, "holds the checkpoints of another run");
  EXPECT_EQ(snapshot(dir / "B"), b_before);

  // Into an empty directory it may go (the step-4 checkpoint, taken as named).
  const testing::CommandResult into_c =
      run("--config " + (dir / "a.json").string() +
          " --set train.steps=6 --set train.output_dir=" + (dir / "C").string() + " --resume " +
          (dir / "A" / "checkpoints" / "step_00000004").string());
  ASSERT_EQ(into_c.exit_code, 0) << into_c.output;
  EXPECT_EQ(testing::entries(dir / "C" / "checkpoints"),
            (std::set<std::string>{"latest", "step_00000006"}));
}

TEST(ResumeSafety, WhatTheNumbersDependOnMustMatchOrTheUserGivesUpBitExactness) {
  testing::ScratchDir dir("resume_mismatch");
  testing::write_small_corpus(dir / "data.txt");
  testing::write_small_corpus(dir / "other.txt", 19000);
  const nlohmann::json base = testing::tiny_run_config(dir / "data.txt", dir / "run");
  TrainOptions first = testing::quiet();
  first.stop_at_step = 4;
  train(parse_train_config(base), first);
  const auto before = snapshot(dir / "run");

  struct Case {
    std::string name;
    nlohmann::json edit;
    std::string key, checkpoint, now;  // what the error must name
  };
  const std::vector<Case> refused = {
      {"lr",
       {{"optimizer", {{"params", {{"lr", 1e-3}}}}}},
       "optimizer.params.lr",
       "0.003",
       "0.001"},
      {"batch",
       {{"train_micro_batch_size_per_gpu", 2}},
       "train_micro_batch_size_per_gpu",
       "4",
       "2"},
      {"accumulation",
       {{"gradient_accumulation_steps", 1}},
       "micro-batches per step",
       "2 (1 x 2)",
       "1 (1 x 1)"},
      {"seq_len", {{"train", {{"seq_len", 8}}}}, "train.seq_len", "16", "8"},
      {"seed", {{"train", {{"seed", 8}}}}, "train.seed", "7", "8"},
      {"warmup",
       {{"scheduler", {{"params", {{"warmup_num_steps", 4}}}}}},
       "scheduler.params.warmup_num_steps",
       "3",
       "4"},
      {"clipping", {{"gradient_clipping", 0.5}}, "gradient_clipping", "has 1,", "0.5"},
      {"data",
       {{"data", {{"train_path", (dir / "other.txt").string()}}}},
       "the training tokens",
       "data.txt",
       "other.txt"},
  };
  for (const Case& c : refused) {
    nlohmann::json json = base;
    json.merge_patch(c.edit);
    TrainOptions resume = testing::quiet();
    resume.resume = dir / "run";
    std::string error;
    try {
      train(parse_train_config(json), resume);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_CONTAINS(error, c.key) << c.name;
    EXPECT_CONTAINS(error, "the checkpoint has ") << c.name;
    EXPECT_CONTAINS(error, c.checkpoint) << c.name;
    EXPECT_CONTAINS(error, c.now) << c.name;
    EXPECT_CONTAINS(error, "--allow-inexact-resume") << c.name;
    EXPECT_EQ(snapshot(dir / "run"), before) << c.name << ": the refused resume wrote";
  }

  // What gives the same bits may change: the update schedule, the subgroups, the stage.
  nlohmann::json same_bits = base;
  same_bits["offload_optimizer"] = {{"schedule", "cpu"}};
  same_bits["zero_optimization"] = {{"sub_group_size", 777}, {"stage", 1}};
  same_bits["train"]["output_dir"] = (dir / "same_bits").string();
  TrainOptions resume = testing::quiet();
  resume.resume = dir / "run" / "checkpoints" / "step_00000004";
  const TrainResult a = train(parse_train_config(same_bits), resume);
  EXPECT_EQ(a.steps_done, 20);
  const TrainResult straight =
      train(parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "straight")),
            testing::quiet());
  EXPECT_EQ(a.state_digest, straight.state_digest);

  // Asked for explicitly, a different learning rate goes on.
  nlohmann::json inexact = base;
  inexact["optimizer"]["params"]["lr"] = 1e-3;
  inexact["train"]["output_dir"] = (dir / "inexact").string();
  resume.allow_inexact_resume = true;
  const TrainResult b = train(parse_train_config(inexact), resume);
  EXPECT_EQ(b.steps_done, 20);
  EXPECT_NE(b.state_digest, straight.state_digest);
}

// How often DeMo's ranks prove their replicas agree changes no number: a resume may change
// it without --allow-inexact-resume; the DeMo hyperparameters still may not change.
TEST(ResumeSafety, DemosReplicaCheckIntervalIsNotAnInexactChange) {
  nlohmann::json json = testing::tiny_run_config("data.txt", "run");
  json["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 1e-3}}}};
  json["demo"] = {{"replica_check_interval", 10}};
  TrainingState then;
  then.config = parse_train_config(json);
  json["demo"]["replica_check_interval"] = 50;
  EXPECT_TRUE(resume_mismatches(then, parse_train_config(json), {}).empty());
  json["optimizer"]["params"]["lr"] = 2e-3;
  const std::vector<ResumeMismatch> lr = resume_mismatches(then, parse_train_config(json), {});
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_EQ(lr[0].key, "optimizer.params.lr");
}

TEST(ResumeSafety, TwoRanksAreOneRankAccumulatingTwoButNotOneAccumulatingOne) {
  testing::ScratchDir dir("resume_ranks");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["eval_interval"] = 0;
  TrainOptions first = testing::quiet();
  first.stop_at_step = 4;
  train(parse_train_config(json), first);  // 1 rank x 2 micro-batches
  TrainOptions resume;
  resume.resume = dir / "run" / "checkpoints" / "step_00000004";
  json["gradient_accumulation_steps"] = 1;
  json["train"]["output_dir"] = (dir / "two").string();
  const testing::RankResults two = testing::train_on_ranks(2, json, resume);
  testing::expect_ranks_agree(two, "2 ranks x 1");
  json["train"]["output_dir"] = (dir / "four").string();
  json["gradient_accumulation_steps"] = 2;
  const testing::RankResults four = testing::train_on_ranks(2, json, resume);
  for (const std::string& e : four.errors) EXPECT_CONTAINS(e, "4 (2 x 2)");
}

TEST(ResumeSafety, ResumingAFinishedRunSaysSoAndWritesNothing) {
  testing::ScratchDir dir("resume_finished");
  testing::write_small_corpus(dir / "data.txt");
  const nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  const TrainResult done = train(parse_train_config(json), testing::quiet());
  const auto before = snapshot(dir / "run");
  TrainOptions resume = testing::quiet();
  resume.resume = dir / "run";
  const TrainResult again = train(parse_train_config(json), resume);
  EXPECT_EQ(again.steps_done, 20);
  EXPECT_TRUE(again.steps.empty());
  EXPECT_EQ(again.last_checkpoint, done.last_checkpoint);
  EXPECT_EQ(again.state_digest, done.state_digest);
  EXPECT_EQ(snapshot(dir / "run"), before);
}

TEST(ResumeSafety, TheRunDirectoryOfEachFormOfCheckpoint) {
  testing::ScratchDir dir("run_directory_of");
  fs::create_directories(dir / "run" / "checkpoints" / "step_00000002");
  const fs::path run = fs::weakly_canonical(dir / "run");
  EXPECT_EQ(run_directory_of(dir / "run"), run);
  EXPECT_EQ(run_directory_of(dir / "run" / "checkpoints"), run);
  EXPECT_EQ(run_directory_of(dir / "run" / "checkpoints" / "step_00000002"), run);
  fs::create_directories(dir / "loose" / "step_00000002");
  EXPECT_EQ(run_directory_of(dir / "loose" / "step_00000002"), std::nullopt);
}

// A rollback starts a timeline of its own: run to step 20 (checkpoints 5, 10, 15, 20),
// resume from step 5 with another learning rate, stop at 13. `--resume RUN` then means what
// `latest` names (step 13, of the new timeline), not the abandoned step 20 of a higher
// number; and pruning counts only the new timeline's checkpoints, leaving the abandoned
// ones alone.
TEST(ResumeSafety, ARollbackKeepsItsTimelineForResumeAndPruning) {
  testing::ScratchDir dir("resume_rollback");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["checkpoint_interval"] = 5;
  train(parse_train_config(json), testing::quiet());
  const fs::path root = dir / "run" / "checkpoints";
  ASSERT_EQ(resolve_checkpoint(root), root / "step_00000020");
  const CheckpointLineage abandoned = checkpoint_lineage(root / "step_00000020");
  ASSERT_FALSE(abandoned.id.empty());
  EXPECT_EQ(abandoned.ancestors.size(), 3u);  // 15, 10, 5

  json["optimizer"]["params"]["lr"] = 1e-3;  // the rollback's change
  json["train"]["keep_checkpoints"] = 2;
  TrainOptions rollback = testing::quiet();
  rollback.resume = root / "step_00000005";
  rollback.allow_inexact_resume = true;
  rollback.stop_at_step = 13;
  train(parse_train_config(json), rollback);
  EXPECT_EQ(resolve_checkpoint(root), root / "step_00000013");
  // The new timeline: 13, 10 (the rollback's, which replaced the abandoned one); step 5,
  // its third, pruned; the abandoned 15 and 20 left alone.
  EXPECT_EQ(testing::entries(root),
            (std::set<std::string>{"latest", "step_00000010", "step_00000013", "step_00000015",
                                   "step_00000020"}));
  EXPECT_EQ(checkpoint_lineage(root / "step_00000013").ancestors.front(),
            checkpoint_lineage(root / "step_00000010").id);
  EXPECT_EQ(newest_verified_checkpoint(dir / "run", checkpoint_lineage).dir,
            root / "step_00000013");

  // Resuming the run with the rollback's config continues the rollback, exactly: no
  // difference to allow, and its first step is 14.
  TrainOptions resume = testing::quiet();
  resume.resume = dir / "run";
  const TrainResult continued = train(parse_train_config(json), resume);
  ASSERT_FALSE(continued.steps.empty());
  EXPECT_EQ(continued.steps.front().step, 14);
  EXPECT_EQ(continued.steps_done, 20);
  EXPECT_EQ(resolve_checkpoint(root), root / "step_00000020");
  EXPECT_EQ(checkpoint_lineage(root / "step_00000020").ancestors.front(),
            checkpoint_lineage(root / "step_00000015").id)
      << "20 and 15 are the continued timeline's now";

  // `latest` deleted by hand: a checkpoints root still resumes from its newest committed
  // checkpoint that verifies, rather than being "not a checkpoint".
  fs::remove(root / "latest");
  EXPECT_EQ(newest_verified_checkpoint(root, checkpoint_lineage).dir, root / "step_00000020");
}

}  // namespace
}  // namespace tandem
