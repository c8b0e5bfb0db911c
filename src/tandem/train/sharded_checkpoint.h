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
#include <string>
#include <utility>
#include <vector>

#include "tandem/dist/communicator.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/train/train_checkpoint.h"

namespace tandem {

struct ShardedOptimizerState {
  int zero_stage = 0;
  bool per_rank = false;  // every rank writes state of its own (optimizer_state_per_rank)
  ParamRange range;       // what this rank writes: its partition, or all parameters
  // Flat arrays over all parameters, valid on `range`, with their names
  // (optimizer_state_names).
  std::vector<std::pair<std::string, const float*>> arrays = {};
};

// A collective. `state` is read on rank 0 only (config, step, positions and the full fp32
// params; its optimizer_state is not used). Returns the checkpoint directory on every rank.
// It is the three phases below in a row.
std::filesystem::path save_sharded_training_checkpoint(
    Communicator& comm, const std::filesystem::path& checkpoints_root, const TrainingState& state,
    const ShardedOptimizerState& shard);

// The phases apart, for lazy checkpoints (train/checkpointer.h), whose files are written
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
ShardReport write_rank_checkpoint_files(ShardedStaging& staging, int rank, int world_size,
                                        const TrainingState& state,
                                        const ShardedOptimizerState& shard);
std::filesystem::path commit_sharded_checkpoint(Communicator& comm, ShardedStaging& staging,
                                                const ShardReport& mine, size_t num_params,
                                                const ShardedOptimizerState& shard);

}  // namespace tandem
