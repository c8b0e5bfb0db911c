// When and how a run's checkpoints reach the disk.
//
// Lazy (train.lazy_checkpoints, the default; one rank): at a checkpoint step the trainer
// state (step, data position, RNG) is recorded and the update engine starts copying its
// state arrays into a snapshot (UpdateEngine::begin_capture) while the next step's forward
// and backward run; that step's update waits only for the subgroups it is about to change.
// A background thread (BackgroundCheckpointWriter) waits for the copies to land and
// writes the snapshot while training goes on: atomically, checksummed, `latest` moved
// last, as a synchronous save does. At most one checkpoint is in flight: the next checkpoint step
// waits for the last write, and that wait is part of its stall.
//
// Synchronous (lazy_checkpoints false, several ranks, and the run's last checkpoint): the
// loop stops until the save returns.
//
// Either way, each checkpoint's stall (milliseconds the training loop was blocked by it)
// and flush time are recorded, old checkpoints beyond train.keep_checkpoints are removed
// once a newer one is committed, and a failed write stops the run or is noted, as
// train.checkpoint_failure says, with the previous checkpoint intact.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "tandem/ckpt/background_writer.h"
#include "tandem/train/train_checkpoint.h"
#include "tandem/train/trainer.h"

namespace tandem {

class UpdateEngine;
struct UpdateStepStats;

class Checkpointer {
 public:
  // `root`: the run's checkpoints directory. With several ranks every save is a
  // collective (save_now only) that fails on every rank together, so its failure is
  // always thrown; rank 0 removes old checkpoints.
  // `lazy`: lazy checkpoints will be taken, and the snapshot's memory (a copy of the
  // engine's state arrays, as `tandem plan` counts it) is allocated now, not at the first
  // checkpoint step.
  Checkpointer(const TrainConfig& config, UpdateEngine& engine, std::filesystem::path root,
               int rank, int world_size, bool lazy);
  // Ends a capture still landing in the snapshot (after a failed step), then finishes
  // a write in flight.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // A lazy checkpoint of `state` (its config, step, positions and RNG; the arrays come
  // from the engine): waits for the write in flight, then starts the capture.
  void begin_lazy(TrainingState state);
  // Call after every step's update (with its stats): a capture begun before it has
  // landed; its stall is complete.
  void after_step(const UpdateStepStats& stats);
  // A synchronous checkpoint: waits for the write in flight, then runs `save` (which
  // returns the checkpoint's path, empty on ranks that write nothing).
  void save_now(int64_t step, const std::function<std::filesystem::path()>& save);

  // Checkpoints completed since the last call, in order; `wait`: first finish the one in
  // flight. A failed write throws (checkpoint_failure "stop") or comes back with its
  // error (and no path).
  std::vector<CheckpointRecord> collect(bool wait);

 private:
  CheckpointRecord finished(const BackgroundCheckpointWriter::Outcome& outcome);
  // Waits for the write in flight and keeps its outcome for collect(); the milliseconds.
  double wait_for_write_in_flight();
  // The bytes a checkpoint of this run takes, roughly (for a disk-full message).
  uint64_t checkpoint_bytes() const;
  std::filesystem::path write(const TrainingState& state) const;

  const TrainConfig& config_;
  UpdateEngine& engine_;
  std::filesystem::path root_;
  int rank_, world_size_;
  // The snapshot being captured or written: its arrays are allocated once and reused.
  TrainingState snapshot_;
  std::optional<int64_t> capturing_step_;
  double pending_stall_ms_ = 0;  // of the checkpoint captured or in flight
  std::vector<CheckpointRecord> done_;
  BackgroundCheckpointWriter writer_;  // last: finishes before the snapshot goes
};

}  // namespace tandem
