// A run's checkpoints, one system attached to the training loop through its hooks
// (core/step_hooks.h): the resume at the start (the newest checkpoint of the run that
// verifies, checked against the run about to start, streamed into the update engine), after
// every step the checkpoint due at it (lazy, or written now: the run's last, and every one
// with train.lazy_checkpoints false), the checkpoints completed since, and before an error
// the one in flight. How a checkpoint reaches the disk is checkpointer.h's; the loop's own
// position (step, data, sampling RNG) comes from the trainer, which is told each checkpoint
// completed (or failed).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "tandem/ckpt/checkpoint_record.h"
#include "tandem/ckpt/checkpointer.h"
#include "tandem/ckpt/run_lineage.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/core/rng.h"
#include "tandem/core/step_hooks.h"
#include "tandem/data/loader.h"

namespace tandem {

class Communicator;
class DataParallel;
class Device;
class UpdateEngine;

// Where the loop is: what a checkpoint records of it and a resume gives back.
struct LoopPosition {
  int64_t step = 0;  // optimizer steps completed
  DataLoader::Position train_position;
  Rng::State sample_rng{};
};

class RunCheckpoints : public StepHooks {
 public:
  struct Parts {
    const TrainConfig& config;
    Communicator& comm;
    UpdateEngine& engine;
    Device& device;
    DataParallel& data_parallel;
    std::filesystem::path root;  // the run's checkpoints directory
    const CheckpointSnapshotPlan& snapshot;
    bool saves = true;  // false: checkpoints are neither written nor due (benchmarks)
    // What the run trains on, for a resume's checks and the checkpoints' records.
    std::string train_tokens_xxh3;
    uint64_t train_tokens = 0;
    std::function<LoopPosition()> position;
    // Called before each checkpoint is begun (the run directory still held).
    std::function<void()> before_save;
    // Each checkpoint completed, or failed under train.checkpoint_failure "continue".
    std::function<void(CheckpointRecord)> recorded;
    // A line for the user (passed-over checkpoints, the resume's notes).
    std::function<void(const std::string&)> note;
  };
  explicit RunCheckpoints(Parts parts);

  // Every rank at the start of a run: agrees on the token of its checkpoints' lineage (a
  // collective).
  void start();
  // Resumes the run from `requested` (a run directory, a checkpoints root or a checkpoint):
  // the newest checkpoint of its timeline that verifies, refused by `refuse` when it is
  // another run's, checked against this run (resume_check.h; `allow_inexact`), its state
  // streamed into the engine. Returns its path and the loop's position in it.
  std::filesystem::path resume(const std::filesystem::path& requested, bool allow_inexact,
                               const std::function<void(const std::filesystem::path&)>& refuse,
                               LoopPosition& position);

  void step_attempted(int64_t step) override;
  void step_finished(int64_t step, bool last) override;
  void stopping_on_error() override;

 private:
  TrainingState state_now() const;
  RankCheckpointLayout rank_layout();
  // A synchronous save (a collective with several ranks); rank 0 returns its path.
  std::filesystem::path save();
  void record(std::vector<CheckpointRecord> records);

  Parts parts_;
  RunLineage lineage_;
  Checkpointer checkpointer_;
};

}  // namespace tandem
