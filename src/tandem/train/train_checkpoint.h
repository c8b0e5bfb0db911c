// A training checkpoint: everything needed to continue a run bit for bit.
//
//   step_00000500/
//     model.safetensors      weights, Hugging Face GPT-2 names and layout (F32)
//     config.json            Hugging Face GPT-2 config, so `transformers` loads the dir
//     optimizer.safetensors  AdamW moments: exp_avg.<name>, exp_avg_sq.<name> (tandem layout)
//     trainer_state.json     step, data-loader position, RNG state, the run config
//     manifest.json          size and XXH3-64 checksum of each file above
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/core/rng.h"
#include "tandem/data/loader.h"
#include "tandem/model/param_layout.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/train/train_config.h"

namespace tandem {

struct TrainingState {
  TrainConfig config;
  int64_t step = 0;  // optimizer steps completed
  DataLoader::Position train_position;
  Rng::State sample_rng{};
  std::vector<float> params;  // flat, tandem layout
  std::vector<float> exp_avg;
  std::vector<float> exp_avg_sq;
};

// Writes a checkpoint directory under checkpoints_root (atomically; see
// save_checkpoint_dir) and returns its path.
std::filesystem::path save_training_checkpoint(const std::filesystem::path& checkpoints_root,
                                               const TrainingState& state);

// The files of a checkpoint of `state`: model.safetensors, config.json,
// trainer_state.json and, with_optimizer, optimizer.safetensors (sharded_checkpoint.h
// writes the moments in shards instead). They refer to `state`, which must outlive them.
std::vector<CheckpointFileWriter> training_checkpoint_files(const TrainingState& state,
                                                            bool with_optimizer);

// Loads from a checkpoint directory, a checkpoints root or a run directory. The
// checksums of the files read are verified first: a damaged checkpoint is refused with
// the file named. Reads one optimizer.safetensors or the shards of a data-parallel run
// (sharded_checkpoint.h), whatever world size wrote them.
TrainingState load_training_checkpoint(const std::filesystem::path& path);
// The same, with the Adam moments read only within `keep` (zero elsewhere): a rank's
// partition, from the shards that overlap it.
TrainingState load_training_checkpoint(const std::filesystem::path& path, ParamRange keep);

// Model weights and config only (what `tandem sample` needs); checksums verified.
TrainingState load_checkpoint_weights(const std::filesystem::path& path);

}  // namespace tandem
