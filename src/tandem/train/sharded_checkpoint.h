// Checkpoints of a data-parallel run: rank 0 writes the weights (Hugging Face safetensors,
// whatever the world size), the config and the trainer state; every rank writes its own
// shard of the Adam moments (its ZeRO partition), into one staging directory on the
// shared filesystem; rank 0 writes the manifest last, recording the partitioning:
//
//   step_00000500/
//     model.safetensors, config.json, trainer_state.json    rank 0
//     optimizer_shard_00001_of_00004.safetensors            rank 1: exp_avg, exp_avg_sq
//                                                            over [begin, end) (flat layout)
//     manifest.json   files + "optimizer_shards": {"num_params", "world_size", "zero_stage",
//                     "shards": [{"file", "begin", "end"}, ...]}
//
// load_training_checkpoint (train_checkpoint.h) reads it at any world size and stage: a
// rank reads the shards that overlap the range it keeps, so no conversion step exists.
// A rank that fails to write leaves nothing published: every rank learns it and throws.
#pragma once

#include <filesystem>

#include "tandem/dist/communicator.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/train/train_checkpoint.h"

namespace tandem {

struct ShardedOptimizerState {
  int zero_stage = 0;
  ParamRange range;  // this rank's partition
  // Flat arrays over all parameters, valid on `range`.
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
};

// A collective. `state` is read on rank 0 only (config, step, positions and the full fp32
// params; its exp_avg/exp_avg_sq are not used). Returns the checkpoint directory on every
// rank.
std::filesystem::path save_sharded_training_checkpoint(
    Communicator& comm, const std::filesystem::path& checkpoints_root, const TrainingState& state,
    const ShardedOptimizerState& shard);

}  // namespace tandem
