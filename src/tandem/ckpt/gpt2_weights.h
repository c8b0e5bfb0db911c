// GPT-2 weights in Hugging Face's safetensors layout, so a tandem checkpoint loads in
// `transformers` (GPT2LMHeadModel.from_pretrained on the checkpoint directory) and a
// Hugging Face GPT-2 checkpoint loads in tandem.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tandem/ckpt/safetensors.h"
#include "tandem/model/gpt_config.h"
#include "tandem/model/param_layout.h"

namespace tandem {

// Writes params (host, flat, tandem layout) as F32 tensors with Hugging Face names.
// Conv1D weights (ParamView::hf_transposed) are written transposed, [in, out].
void write_gpt2_safetensors(const std::filesystem::path& path, const ParamLayout& layout,
                            const float* params);

// Fills params (host, flat, tandem layout) from a file with Hugging Face names and
// layout. Errors name the file and the missing or mis-shaped tensor. A `prefix` reads
// tensors stored as prefix + name (e.g. "grad." in test fixtures).
void read_gpt2_safetensors(const SafetensorsFile& file, const ParamLayout& layout, float* params,
                           const std::string& prefix = "");

// The Hugging Face config.json for this model (model_type gpt2, tied embeddings,
// gelu_new, layer_norm_epsilon 1e-5, no dropout).
nlohmann::json hf_gpt2_config(const GptConfig& config);

}  // namespace tandem
