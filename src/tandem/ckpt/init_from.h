// Starting a run from a Hugging Face model directory (`train.init_from`, fine-tuning):
// config.json must describe the model the run's config does, and the weights
// (model.safetensors, or shards with model.safetensors.index.json; F32, BF16 or F16) must
// have the layout's names and shapes.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include "tandem/model/model_config.h"
#include "tandem/model/model_family.h"  // read_hf_model_config
#include "tandem/model/param_layout.h"

namespace tandem {

// The initial parameters (fp32, flat, `layout`'s order) read from `dir`. Throws
// tandem::Error in one line naming the directory and what does not fit: no config.json, a
// model type tandem does not read, each differing model key with both values, a missing
// tensor, a shape.
std::vector<float> read_init_weights(const std::filesystem::path& dir, const ModelConfig& model,
                                     const ParamLayout& layout);

}  // namespace tandem
