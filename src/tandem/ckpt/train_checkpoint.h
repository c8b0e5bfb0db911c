// A training checkpoint: everything needed to continue a run bit for bit.
//
//   step_00000500/
//     model.safetensors      weights, Hugging Face GPT-2 names and layout (F32)
//     config.json            Hugging Face GPT-2 config, so `transformers` loads the dir
//     optimizer.safetensors  the optimizer's state, <array>.<name> (tandem layout): AdamW's
//                            exp_avg and exp_avg_sq, DeMo's delta
//     trainer_state.json     step, data-loader position, RNG state, the run config
//     manifest.json          size and XXH3-64 checksum of each file above
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/config/train_config.h"
#include "tandem/core/rng.h"
#include "tandem/data/loader.h"
#include "tandem/model/param_layout.h"
#include "tandem/model/param_range.h"
#include "tandem/offload/offload_plan.h"

namespace tandem {

struct TrainingState {
  TrainConfig config;
  int64_t step = 0;  // optimizer steps completed
  DataLoader::Position train_position;
  Rng::State sample_rng{};
  std::vector<float> params;  // flat, tandem layout
  // The optimizer's state beside the params, flat, one array per name of
  // optimizer_family(config.optimizer.type).state_names() (optim/optimizer_family.h), in that
  // order: AdamW exp_avg, exp_avg_sq; DeMo delta (this rank's: each rank keeps its own).
  std::vector<std::vector<float>> optimizer_state;
  // What the run trained on, for resume's checks (ckpt/resume_check.h): the training
  // tokens' XXH3-64 (hex) and count, and the world size; empty and 0 in checkpoints
  // written before tandem recorded them.
  std::string train_tokens_xxh3;
  uint64_t train_tokens = 0;
  int world_size = 0;
  // Its place in the run's history (ckpt/checkpoint_dir.h, CheckpointLineage): this
  // checkpoint's id and its timeline's earlier ones, newest first; empty in checkpoints
  // written before tandem recorded them.
  CheckpointLineage lineage;

  // Everything but the arrays (what a streamed checkpoint's writer needs: the pieces bring
  // the arrays), without copying them. A field added above belongs in it.
  TrainingState without_arrays() const;

  // The array named `name` (throws naming it when the optimizer keeps none of that name).
  const std::vector<float>& optimizer_array(const std::string& name) const;
};

// Which part of a checkpoint's optimizer state a rank reads.
struct OptimizerStateSlice {
  // State partitioned over the ranks (AdamW): only within `keep`, zero elsewhere.
  ParamRange keep{0, SIZE_MAX};
  // State of each rank's own (DeMo): rank `rank`'s, of a checkpoint written by `world_size`
  // ranks (another world size is refused).
  int rank = 0;
  int world_size = 1;
};

// Throws, naming the tensor, the value and its index, when data[0, n) holds a NaN or an
// infinity: no checkpoint is written that could not be resumed. The message contains
// kNotFiniteMessage.
void check_finite_tensor(const std::string& tensor, const float* data, size_t n, int64_t step);
inline constexpr const char* kNotFiniteMessage = "is not finite";

// Writes a checkpoint directory under checkpoints_root (atomically; see
// save_checkpoint_dir) and returns its path.
std::filesystem::path save_training_checkpoint(const std::filesystem::path& checkpoints_root,
                                               const TrainingState& state);

// Where a checkpoint's arrays are read from, one tensor at a time: array 0 the fp32 params,
// 1 + k optimizer array k; `range` a tensor's elements (flat layout order); `scratch`
// room for range.size() floats that the source may fill and point into. The pointer need
// stay valid only until the next call.
using StateSource = std::function<const float*(size_t array, ParamRange range, float* scratch)>;
// `state`'s own arrays as a source (`state` must outlive it).
StateSource arrays_source(const TrainingState& state);
// The same checkpoint with every array read from `arrays` (`state`'s own are not used):
// a synchronous save from where the state lives (UpdateEngine::state_span), with no copy
// of it. Each tensor is checked finite as it is written.
std::filesystem::path save_training_checkpoint(const std::filesystem::path& checkpoints_root,
                                               const TrainingState& state,
                                               const StateSource& arrays);

// The files of a checkpoint of `state`: model.safetensors, config.json,
// trainer_state.json and, with_optimizer, optimizer.safetensors (sharded_checkpoint.h
// writes the moments in shards instead). They refer to `state`, which must outlive them.
std::vector<CheckpointFileWriter> training_checkpoint_files(const TrainingState& state,
                                                            bool with_optimizer);

// The small files of a checkpoint of `state`, which must outlive them: config.json and
// trainer_state.json (training_checkpoint_files writes them after the weights).
std::vector<CheckpointFileWriter> training_checkpoint_json_files(const TrainingState& state);

// The writer of optimizer.safetensors: for each view of the layout, each optimizer array
// as "<array>.<view name>", tandem layout. Its data points into state.optimizer_state
// (null for arrays `state` does not hold: enough for SafetensorsWriter::placement).
SafetensorsWriter optimizer_file_writer(const TrainingState& state, const ParamLayout& layout);

// Everything in a checkpoint but its arrays (trainer_state.json, verified against the
// manifest), from a checkpoint directory, a checkpoints root or a run directory.
TrainingState read_training_state(const std::filesystem::path& path);

// Where a resume's arrays go, piece by piece: array 0 the fp32 params, 1 + k optimizer array
// k; `values` holds range.size() floats of flat layout order, valid during the call.
using StateSink = std::function<void(size_t array, ParamRange range, const float* values)>;
// Streams the arrays of the checkpoint at `path` (whose state read_training_state gave)
// into `sink` with bounded memory: each file read once, front to back, a few MiB at a time
// (and a Conv1D weight whole, to transpose it), checksummed as it is read. The params come
// whole; the optimizer state from one optimizer.safetensors or the shards of a
// data-parallel run (sharded_checkpoint.h), whatever world size wrote it: only within
// slice.keep (partitioned state), or rank slice.rank's own. Every element of what is asked
// comes once. A file whose checksum differs from the manifest's throws, naming it, once it
// has been read: whatever `sink` took must then be dropped (a resume has checked every
// file first: newest_verified_checkpoint). `place`, if set, may name host memory of a
// piece's size to read it straight into (null: through the buffer), which `sink` is then
// handed as `values`: where the state ends up, to save a copy. Returns the bytes read.
using StatePlace = std::function<float*(size_t array, ParamRange range)>;
uint64_t stream_training_arrays(const std::filesystem::path& path, const TrainingState& state,
                                const OptimizerStateSlice& slice, const StateSink& sink,
                                const StatePlace& place = {});

// read_training_state and stream_training_arrays into host arrays: a damaged file is
// refused with its name. State outside slice.keep is zero.
TrainingState load_training_checkpoint(const std::filesystem::path& path,
                                       const OptimizerStateSlice& slice = {});

// The lineage a checkpoint's trainer_state.json records (empty for older checkpoints);
// throws naming the file when it cannot be read. What the checkpoint layer is told to
// follow a run's timeline with (newest_verified_checkpoint, prune_checkpoints).
CheckpointLineage checkpoint_lineage(const std::filesystem::path& checkpoint_dir);

// Model weights and config only (what `tandem sample` needs); checksums verified.
TrainingState load_checkpoint_weights(const std::filesystem::path& path);

// The checkpoint at `path` that load_checkpoint_weights should read: chosen as --resume
// chooses (newest_verified_checkpoint, following the run's timeline), the files it reads
// (the trainer state and the weights) verified; a newer one damaged there is passed over
// and named in `damaged`. A checkpoint directory is taken as named, or refused naming an
// intact one beside it. Throws, naming every one it tried, when none is intact.
ResumableCheckpoint newest_checkpoint_with_weights(const std::filesystem::path& path);

}  // namespace tandem
