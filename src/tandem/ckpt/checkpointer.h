// When and how a run's checkpoints reach the disk.
//
// Lazy (train.lazy_checkpoints, the default): at a checkpoint step the trainer state
// (step, data position, RNG) is recorded and the update engine starts copying its state
// arrays into a snapshot (UpdateEngine::begin_capture) while the next step's forward and
// backward run; that step's update waits only for the subgroups it is about to change. A
// background thread (BackgroundCheckpointWriter) writes the snapshot while training goes
// on: atomically, checksummed, `latest` moved last, as a synchronous save does. With one
// rank the write starts as soon as the copies land; with several, after the next update
// (at ZeRO stages 1-3 the fp32 params are gathered first, a collective), each rank writing
// its own files into rank 0's staging directory (ckpt/sharded_checkpoint.h), and the
// ranks learn at the end of each step whether all are durable (a small collective while a
// checkpoint is in flight); then rank 0 commits. At most one checkpoint is in flight: the
// next checkpoint step waits for the last, and that wait is part of its stall.
//
// Synchronous (lazy_checkpoints false, and the run's last checkpoint): the loop stops
// until the save returns.
//
// Streamed (the plan's CheckpointSnapshotPlan, when a full copy of the state does not fit
// the host memory a snapshot may take): lazy and synchronous checkpoints alike pass
// through a bounded pool of pinned slots (offload/snapshot_pool.h) that the engine's
// capture thread fills and the writer drains into files laid out in advance
// (ckpt/streamed_checkpoint.h); with several ranks, each rank its own pool and files,
// without a gather. A full pool makes the next update wait for the disk (back-pressure),
// counted in the stall.
//
// Either way, each checkpoint's stall (milliseconds the training loop was blocked by it)
// and flush time are recorded, old checkpoints beyond train.keep_checkpoints are removed
// once a newer one is committed, and a failed write stops the run or is noted, as
// train.checkpoint_failure says (on every rank alike), with the previous checkpoint
// intact.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tandem/ckpt/background_writer.h"
#include "tandem/ckpt/checkpoint_record.h"
#include "tandem/ckpt/sharded_checkpoint.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/config/memory_plan.h"
#include "tandem/device/device.h"
#include "tandem/offload/snapshot_pool.h"

namespace tandem {

class Communicator;
class UpdateEngine;
struct UpdateStepStats;

// What this rank contributes to a checkpoint of a data-parallel run (unused with one).
struct RankCheckpointLayout {
  int zero_stage = 0;
  bool per_rank = false;           // every rank writes all of its own optimizer state (DeMo)
  ParamRange range;                // the optimizer state this rank writes
  std::vector<std::string> names;  // OptimizerFamily::state_names
  // Fills the fp32 params outside this rank's partition from their owners (a collective);
  // empty where every rank holds them all.
  std::function<void(float* params)> gather_params;

  // The shard this rank writes, its arrays read from `source` (a streamed snapshot's
  // writer reads none: the pieces bring them).
  ShardedOptimizerState shard_of(StateSource source = {}) const;

  // What rank `rank` writes of a checkpoint of `config`: its partition of the optimizer
  // state (`held`; at stage 0 the state is whole on every rank, and rank 0's shard is all
  // of it), or, for state every rank keeps of its own (DeMo), all of it; and, from stage 1,
  // `gather_params` to get the fp32 params whole.
  static RankCheckpointLayout of(const TrainConfig& config, int rank, ParamRange held,
                                 std::function<void(float* params)> gather_params);
};

class Checkpointer {
 public:
  // `root`: the run's checkpoints directory; `saves`: checkpoints will be taken. The
  // snapshot's memory, as the plan says (`snapshot`, as `tandem plan` counts it), is
  // allocated now, not at the first checkpoint step: a full copy of the engine's state
  // arrays for lazy checkpoints (on a GPU, Device::kind kCuda, the capture goes to pinned
  // memory, so that the device-to-host copies run asynchronously, and the writer copies it
  // out before writing), or the pool a streamed snapshot passes through (lazy and
  // synchronous checkpoints alike; one rank only).
  Checkpointer(const TrainConfig& config, UpdateEngine& engine, Device& device, Communicator& comm,
               std::filesystem::path root, RankCheckpointLayout layout,
               const CheckpointSnapshotPlan& snapshot, bool saves);
  // Ends a capture still landing in the snapshot (after a failed step), then finishes
  // a write in flight (its files stay unpublished when other ranks cannot commit them).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // A lazy checkpoint of `state` (its config, step, positions and RNG; the arrays come
  // from the engine): finishes the checkpoint in flight, then starts the capture. Every
  // rank calls it at the same step.
  void begin_lazy(TrainingState state);
  // Call after every step's update (with its stats), on every rank: a capture begun before
  // it has landed; its stall is complete.
  void after_step(const UpdateStepStats& stats);
  // A synchronous checkpoint of `state` (as begin_lazy's): finishes the checkpoint in
  // flight, then runs `save` (which returns the checkpoint's path; empty on ranks other
  // than 0), or streams the state through the pool.
  void save_now(TrainingState state, const std::function<std::filesystem::path()>& save);

  // Checkpoints completed since the last call, in order; `wait`: first finish the one in
  // flight. A failed write throws (checkpoint_failure "stop") or comes back with its
  // error (and no path). Every rank calls it after every step.
  std::vector<CheckpointRecord> collect(bool wait);

 private:
  bool several_ranks() const;
  CheckpointRecord finished(const BackgroundCheckpointWriter::Outcome& outcome);
  // What a failed checkpoint leaves: "; the previous checkpoint, step_N, is intact and
  // 'latest' still names it", or that none is on disk.
  std::string intact_checkpoint_text() const;
  // Finishes the checkpoint in flight (several ranks: a collective) and keeps its record
  // for collect().
  void finish_in_flight();
  // Several ranks: commits the checkpoint in flight once every rank's files are durable
  // (`wait`: waits for this rank's); a collective.
  void try_commit(bool wait);
  // The bytes a checkpoint of this run takes, roughly (for a disk-full message).
  uint64_t checkpoint_bytes() const;
  std::filesystem::path write(const TrainingState& state) const;
  // Streamed snapshots. Starts the capture into the pool (nothing on a rank without one).
  void begin_streamed_capture();
  // Hands every piece of the capture to `write` as its copies land, then frees its slot.
  void drain_pool(const std::function<void(ParamRange, std::span<const float* const>)>& write);
  // One rank: writes the checkpoint of `state` (its config, step, positions, RNG) from the
  // pieces of a streamed capture as they arrive; abandons the pool when it fails.
  std::filesystem::path write_streamed(const TrainingState& state);
  // Several ranks: this rank's files in `staging` from the pieces (never throws).
  ShardReport write_rank_streamed(const ShardedStaging& staging);
  // A synchronous save through the pool, this thread writing (collective with several ranks).
  std::filesystem::path save_streamed_now(TrainingState state);
  // Where the engine's state array k is captured: the pinned buffer, or the snapshot.
  float* capture_target(size_t k);
  // The pinned buffer's contents into the snapshot's arrays (nothing without one).
  void copy_out_of_pinned();

  const TrainConfig& config_;
  UpdateEngine& engine_;
  Communicator& comm_;
  std::filesystem::path root_;
  RankCheckpointLayout layout_;
  // The snapshot being captured or written: its arrays are allocated once and reused.
  TrainingState snapshot_;
  DeviceAllocation pinned_;             // GPU: the capture's target, state_floats x P floats
  bool streamed_ = false;               // the snapshot streams through a pool
  std::unique_ptr<SnapshotPool> pool_;  // its pool, in place of both (a rank that writes)
  std::optional<int64_t> capturing_step_;
  double pending_stall_ms_ = 0;  // of the checkpoint captured or in flight
  std::vector<CheckpointRecord> done_;
  // Several ranks: the staging directory of the checkpoint in flight, and what this
  // rank's write reported.
  std::unique_ptr<ShardedStaging> staging_;
  ShardReport report_;
  BackgroundCheckpointWriter writer_;  // last: finishes before the snapshot goes
};

}  // namespace tandem
