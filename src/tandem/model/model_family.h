// The model families tandem trains, as one table: everything the rest of tandem needs to
// know about a family is a row of it. Code that takes a ModelConfig (memory plans,
// checkpoints, the trainer) asks the table, never the family's class, so adding a family
// is a new model/<family>.{h,cc} and one row (docs/models.md).
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "tandem/compute/compute_backend.h"
#include "tandem/core/json_reader.h"
#include "tandem/model/model.h"
#include "tandem/model/model_config.h"
#include "tandem/model/param_layout.h"
#include "tandem/model/recompute_segments.h"

namespace tandem {

struct ModelFamily {
  ModelType type;
  // Hugging Face's name of the model class (config.json "architectures").
  std::string_view hf_architecture;
  // The flat parameter layout: Hugging Face names and shapes, the blocks.
  ParamLayout (*layout)(const ModelConfig& config);
  // Bytes of activations and scratch a model allocates for batches of B x T, besides its
  // parameters and gradients, recomputing every `recompute_interval` layers
  // (ModelOwnBuffers; 0: keeping every layer's activations).
  size_t (*activation_bytes)(const ModelConfig& config, int B, int T, StorageDType dtype,
                             int recompute_interval, bool kept_on_host);
  std::unique_ptr<Model> (*make)(const ModelConfig& config, ComputeBackend& backend, int B, int T,
                                 StorageDType dtype, ModelOwnBuffers own);
  // The Hugging Face config.json of a model, and the model of a config.json (throws
  // tandem::Error naming the key that is missing or that tandem does not support).
  nlohmann::json (*to_hf_config)(const ModelConfig& config);
  ModelConfig (*from_hf_config)(const nlohmann::json& hf);
  // The run config's "model" section of this family (its own key names, "type" among
  // them): read from the family's defaults, sizes it leaves out filled in, checked; and
  // written back with every key.
  ModelConfig (*read_run_config)(const JsonSection& model);
  nlohmann::json (*write_run_config)(const ModelConfig& config);
};

const ModelFamily& model_family(ModelType type);
// The family whose Hugging Face model_type is `hf_model_type` ("gpt2", "llama"); throws
// naming the types tandem reads.
const ModelFamily& model_family_of_hf(std::string_view hf_model_type);

// The model a Hugging Face model directory's config.json describes (its model_type's row).
// Throws tandem::Error in one line naming `option` and the directory: not a directory, no
// config.json, not JSON, a model type or a feature tandem does not compute.
ModelConfig read_hf_model_config(const std::filesystem::path& dir,
                                 std::string_view option = "train.init_from");

// Shorthands through the table.
inline ParamLayout model_layout(const ModelConfig& config) {
  return model_family(config.type).layout(config);
}
// `kept_on_host`: activation_checkpointing.cpu_checkpointing (the kept outputs in device
// memory are then two rows; model_kept_output_host_bytes are in pinned host memory).
inline size_t model_activation_bytes(const ModelConfig& config, int B, int T,
                                     StorageDType dtype = StorageDType::kF32,
                                     int recompute_interval = 0, bool kept_on_host = false) {
  return model_family(config.type)
      .activation_bytes(config, B, T, dtype, recompute_interval, kept_on_host);
}
// Every family keeps one [B, T, C] output per segment of `recompute_interval` layers.
inline size_t model_kept_output_host_bytes(const ModelConfig& config, int B, int T,
                                           StorageDType dtype, int recompute_interval) {
  const RecomputeSegments segments{.layers = config.n_layer, .interval = recompute_interval};
  return segments.kept_outputs() * static_cast<size_t>(B) * T * config.n_embd *
         storage_dtype_bytes(dtype);
}
inline std::unique_ptr<Model> make_model(const ModelConfig& config, ComputeBackend& backend,
                                         int max_batch, int max_seq_len,
                                         StorageDType dtype = StorageDType::kF32,
                                         ModelOwnBuffers own = {}) {
  return model_family(config.type).make(config, backend, max_batch, max_seq_len, dtype, own);
}

}  // namespace tandem
