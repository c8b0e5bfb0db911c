// Non-finite numbers never reach a checkpoint: a step whose loss or gradient norm is not
// finite is skipped (the state untouched, counted in the metrics), too many in a row stop
// training with an error that names the intact checkpoint and says whether clipping was
// on, and a save refuses a state that holds a NaN or an infinity, naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/streamed_checkpoint.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/model/model_family.h"
#include "tandem/model/param_layout.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

TEST(NonFinite, AStepWithANanGradientIsSkippedAndTrainingGoesOn) {
  testing::ScratchDir dir("nonfinite_skip");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["train"]["steps"] = 6;
  json["train"]["checkpoint_interval"] = 2;
  TrainOptions options = testing::quiet();
  options.nan_gradient_attempts = {3};
  options.metrics_path = dir / "metrics.jsonl";
  const TrainResult result = train(parse_train_config(json), options);
  EXPECT_EQ(result.steps_done, 6);
  EXPECT_EQ(result.skipped_steps, 1);
  EXPECT_EQ(result.steps.size(), 6u);
  // The metrics say which attempt was skipped and why.
  const std::string metrics = read_file_text(dir / "metrics.jsonl");
  EXPECT_CONTAINS(metrics, "\"skipped\":true");
  EXPECT_CONTAINS(metrics, "\"skipped_in_a_row\":1");
  // Before the skip, the run is the clean run; after it, every checkpoint is finite.
  json["train"]["output_dir"] = (dir / "clean").string();
  TrainOptions clean = testing::quiet();
  clean.stop_at_step = 2;
  const TrainResult reference = train(parse_train_config(json), clean);
  EXPECT_EQ(read_file_bytes(result.checkpoints[0].path / "optimizer.safetensors"),
            read_file_bytes(reference.last_checkpoint / "optimizer.safetensors"));
  for (const CheckpointRecord& record : result.checkpoints) {
    ASSERT_TRUE(record.error.empty()) << record.error;
    const TrainingState state = load_training_checkpoint(record.path);
    EXPECT_TRUE(all_finite(state.params)) << record.path;
    for (const std::vector<float>& array : state.optimizer_state)
      EXPECT_TRUE(all_finite(array)) << record.path;
  }
}

TEST(NonFinite, TooManySkipsInARowStopTrainingNamingTheIntactCheckpoint) {
  testing::ScratchDir dir("nonfinite_stop");
  testing::write_small_corpus(dir / "data.txt");
  for (const double clipping : {1.0, 0.0}) {
    nlohmann::json json =
        testing::tiny_run_config(dir / "data.txt", dir / cat("run_", clipping > 0));
    json["train"]["steps"] = 6;
    json["train"]["checkpoint_interval"] = 2;
    json["train"]["max_skipped_steps"] = 2;
    json["gradient_clipping"] = clipping;
    TrainOptions options = testing::quiet();
    options.nan_gradient_attempts = {3, 4, 5, 6};
    std::string error;
    try {
      train(parse_train_config(json), options);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_CONTAINS(error, "step 3: the loss or gradient norm was not finite in 3 attempts");
    EXPECT_CONTAINS(error, "train.max_skipped_steps = 2");
    EXPECT_CONTAINS(error, "The optimizer state is that of step 2, untouched by them");
    EXPECT_CONTAINS(error, "step_00000002, is intact");
    EXPECT_CONTAINS(error, clipping > 0 ? "Gradient clipping was on (max norm 1)"
                                        : "Gradient clipping was off");
    std::printf("[ note ] %s\n", error.c_str());
  }
}

TEST(NonFinite, RanksSkipTogether) {
  testing::ScratchDir dir("nonfinite_ranks");
  testing::write_small_corpus(dir / "data.txt");
  for (const bool demo : {false, true}) {
    nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / cat("run_", demo));
    json["model"]["n_embd"] = 32;
    json["gradient_accumulation_steps"] = 1;
    json["train"]["steps"] = 4;
    json["train"]["eval_interval"] = 0;
    json["zero_optimization"] = {{"stage", demo ? 0 : 2}};
    if (demo)
      json["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 3e-3}, {"compression_topk", 8}}}};
    TrainOptions options;
    options.nan_gradient_attempts = {2};
    const testing::RankResults ranks = testing::train_on_ranks(2, json, options);
    testing::expect_ranks_agree(ranks, demo ? "DeMo" : "stage 2");
    for (const TrainResult& r : ranks.by_rank) {
      EXPECT_EQ(r.steps_done, 4);
      EXPECT_EQ(r.skipped_steps, 1);
    }
  }
}

TEST(NonFinite, ASaveRefusesANonFiniteStateNamingTheTensor) {
  testing::ScratchDir dir("nonfinite_save");
  TrainingState state;
  state.config = parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "run"));
  state.step = 5;
  const ParamLayout layout = model_layout(state.config.model);
  const size_t P = layout.num_elements();
  state.params = testing::randn(P, 1);
  state.optimizer_state = {testing::randn(P, 2), testing::randn(P, 3)};
  const ParamView& fc = layout.views()[layout.views().size() / 2];
  state.optimizer_state[1][fc.offset + 3] = std::numeric_limits<float>::infinity();
  const std::string tensor = "exp_avg_sq." + fc.name + "[3] = inf is not finite";
  try {
    save_training_checkpoint(dir / "ckpt", state);
    ADD_FAILURE() << "saved a state holding inf";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "refusing to save step 5: " + tensor);
  }
  EXPECT_FALSE(fs::exists(dir / "ckpt" / "latest"));
  // The same when the state streams through a pool.
  {
    StreamedTrainingCheckpoint streamed(dir / "streamed", state);
    const float* arrays[] = {state.params.data(), state.optimizer_state[0].data(),
                             state.optimizer_state[1].data()};
    try {
      streamed.write({0, P}, arrays);
      ADD_FAILURE() << "streamed a state holding inf";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), "exp_avg_sq." + fc.name + "[");
    }
  }
  EXPECT_TRUE(fs::is_empty(dir / "streamed"));
  // And when the save reads the state from where it lives, tensor by tensor: no checkpoint.
  try {
    save_training_checkpoint(
        dir / "sourced", state.without_arrays(), [&](size_t array, ParamRange range, float*) {
          return (array == 0 ? state.params : state.optimizer_state[array - 1]).data() +
                 range.begin;
        });
    ADD_FAILURE() << "saved a state holding inf from its source";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "refusing to save step 5: " + tensor);
  }
  EXPECT_FALSE(fs::exists(dir / "sourced" / "latest"));
  for (const fs::directory_entry& entry : fs::directory_iterator(dir / "sourced"))
    ADD_FAILURE() << "left behind: " << entry.path();
}

}  // namespace
}  // namespace tandem
