// Checkpoints of a data-parallel run: rank 0 writes the weights (Hugging Face safetensors,
// whatever the world size), the config and the trainer state; every rank writes its own
// shard of the optimizer's state (AdamW's moments over its ZeRO partition; DeMo's momentum,
// whole: every rank keeps its own), into one staging directory on the shared filesystem;
// rank 0 writes the manifest last, recording the partitioning:
//
//   step_00000500/
//     model.safetensors, config.json, trainer_state.json    rank 0
//     optimizer_shard_00001_of_00004.safetensors            rank 1: exp_avg, exp_avg_sq (or
//                                                            delta) over [begin, end)
//     manifest.json   files + "optimizer_shards": {"num_params", "world_size", "zero_stage",
//                     "per_rank", "shards": [{"file", "rank", "begin", "end"}, ...]}
//
// load_training_checkpoint (train_checkpoint.h) reads partitioned state at any world size
// and stage: a rank reads the shards that overlap the range it keeps, so no conversion step
// exists. Per-rank state ("per_rank": true) is read by the rank of the same number.
// A rank that fails to write leaves nothing published: every rank learns it and throws.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/communicator.h"
#include "tandem/offload/offload_plan.h"

namespace tandem {

struct ShardedOptimizerState {
  int zero_stage = 0;
  bool per_rank = false;  // every rank writes state of its own (OptimizerFamily::state_per_rank)
  ParamRange range;       // what this rank writes: its partition, or all parameters
  // The optimizer's arrays by name (OptimizerFamily::state_names), and where each is read
  // over pieces of `range`: array 1 + k for names[k] (StateSource, train_checkpoint.h; a
  // synchronous save reads the update engine's own memory, a lazy one its snapshot).
  std::vector<std::string> names = {};
  StateSource source = {};
};

// A collective. `state` is read on rank 0 only (config, step, positions and the full fp32
// params; its optimizer_state is not used). Returns the checkpoint directory on every rank.
// It is the three phases below in a row.
std::filesystem::path save_sharded_training_checkpoint(
    Communicator& comm, const std::filesystem::path& checkpoints_root, const TrainingState& state,
    const ShardedOptimizerState& shard);

// The phases apart, for lazy checkpoints (ckpt/checkpointer.h), whose files are written
// by a background thread while training goes on:
//
// 1. open_sharded_checkpoint (a collective): rank 0 creates the staging directory and
//    every rank learns where it is.
// 2. write_rank_checkpoint_files (no communication, any thread): this rank's optimizer
//    shard and, on rank 0, the weights, config and trainer state; never throws, the
//    report says what was written or why it failed.
// 3. commit_sharded_checkpoint (a collective, once every rank's files are durable): rank
//    0 writes the manifest with every rank's report and publishes; when a rank failed,
//    nothing is published and every rank throws, naming it.
struct ShardedStaging {
  int64_t step = 0;
  std::filesystem::path dir = {};
  std::unique_ptr<StagedCheckpoint> staged = {};  // rank 0's; removed unless published
  // A streamed checkpoint (below), on rank 0: the trainer state (no arrays) for the small
  // files, and the weight files laid out at open, recorded at commit.
  std::unique_ptr<TrainingState> streamed = {};
  std::vector<std::string> weight_files = {};
};

// What a rank tells rank 0 about its files; fixed size, for all_gather.
struct ShardReport {
  uint64_t ok = 0;
  uint64_t written = 0;  // 0: an empty partition, no file
  uint64_t bytes = 0;
  uint64_t begin = 0, end = 0;
  char xxh3_64[17] = {};
  char error[256] = {};
};

ShardedStaging open_sharded_checkpoint(Communicator& comm,
                                       const std::filesystem::path& checkpoints_root, int64_t step);

// Streamed through a bounded pool (ckpt/checkpointer.h), when a full copy of the state does
// not fit in host memory: phase 1 (open_streamed_sharded_checkpoint) also lays out the
// weight files at their full size on rank 0; in phase 2 every rank fills its
// RankStreamedFiles with the pieces of its capture: its optimizer shard and, where it
// writes weights (its partition of the fp32 params from ZeRO stage 1, all of them on rank 0
// below), its part of the weight files; phase 3 is commit_sharded_checkpoint, which on rank 0
// records the weight files (once every rank's part is durable) and writes the small files
// before the manifest. The files are those of a synchronous save, byte for byte.
ShardedStaging open_streamed_sharded_checkpoint(Communicator& comm,
                                                const std::filesystem::path& checkpoints_root,
                                                const TrainingState& state);

class RankStreamedFiles {
 public:
  // Whether rank `rank` writes part of the weights at `zero_stage`.
  static bool writes_params(int zero_stage, int rank) { return zero_stage > 0 || rank == 0; }
  // `shard`'s source is not read (the pieces bring the arrays).
  RankStreamedFiles(const ShardedStaging& staging, int rank, int world_size,
                    const TrainConfig& config, const ShardedOptimizerState& shard);
  ~RankStreamedFiles();
  RankStreamedFiles(const RankStreamedFiles&) = delete;
  RankStreamedFiles& operator=(const RankStreamedFiles&) = delete;

  // As StreamedTrainingCheckpoint::write: this rank's pieces, every state array of `range`.
  void write(ParamRange range, std::span<const float* const> arrays);
  // Every piece written: syncs and closes the files and reports them for the commit.
  ShardReport finish();

 private:
  struct Files;
  std::unique_ptr<Files> files_;
};

// A report of a rank that could not write its files.
ShardReport failed_shard_report(const std::string& error);
ShardReport write_rank_checkpoint_files(ShardedStaging& staging, int rank, int world_size,
                                        const TrainingState& state,
                                        const ShardedOptimizerState& shard);
std::filesystem::path commit_sharded_checkpoint(Communicator& comm, ShardedStaging& staging,
                                                const ShardReport& mine, size_t num_params,
                                                const ShardedOptimizerState& shard);

}  // namespace tandem
