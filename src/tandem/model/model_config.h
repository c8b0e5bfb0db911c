// Hyper-parameters of a model of one of tandem's families (model/model_family.h).
//
// One struct for every family: the fields a family does not use keep the values that make
// it that family's special case (GPT-2 is a Llama-shaped config with n_kv_head = n_head,
// intermediate_size = 4 n_embd and a tied head), so code that only needs sizes (memory
// plans, checkpoints, the data loader) never asks which family it has.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tandem/core/enum_names.h"

namespace tandem {

enum class ModelType {
  kGpt2,   // learned positions, LayerNorm, GELU MLP, biases, head tied to the embedding
  kLlama,  // rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases
};

inline constexpr EnumName<ModelType> kModelTypeNames[] = {{ModelType::kGpt2, "gpt2"},
                                                          {ModelType::kLlama, "llama"}};
constexpr std::string_view model_type_name(ModelType type) {  // "gpt2", "llama"
  return enum_name(kModelTypeNames, type);
}
// Throws tandem::Error naming the known types.
ModelType parse_model_type(std::string_view name);

struct ModelConfig {
  ModelType type = ModelType::kGpt2;
  int vocab_size = 256;      // V: number of token ids
  int context_length = 256;  // maxT: positions (GPT-2's wpe rows; Llama's RoPE table)
  int n_layer = 6;           // L: transformer blocks
  int n_head = 6;            // NH: query heads; n_embd % n_head == 0
  int n_embd = 384;          // C: channels
  // Llama (Hugging Face LlamaConfig names in the JSON config). For GPT-2 these are
  // NH, 4C, unused, unused and true.
  int n_kv_head = 0;                // KVH: key/value heads (num_key_value_heads); 0 = n_head
  int intermediate_size = 0;        // I: SwiGLU width; 0 = 4C (GPT-2's MLP width)
  double rms_norm_eps = 1e-5;       // added to the mean square before its inverse root
  double rope_theta = 10000.0;      // RoPE base
  bool tie_word_embeddings = true;  // the LM head is the token embedding (GPT-2: always)

  int head_size() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int mlp_width() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  // Columns of the fused query/key/value projection: (NH + 2 KVH) * head size.
  int qkv_width() const { return (n_head + 2 * kv_heads()) * head_size(); }
  // Throws tandem::Error naming the offending field ("model.n_head") and what is allowed.
  void validate() const;
  // Total number of parameters (a tied head counted once).
  int64_t num_parameters() const;
  bool operator==(const ModelConfig&) const = default;
};

// "model.n_layer 2 vs 4, model.n_head ..." for every field that differs; empty if none.
std::string describe_model_difference(const ModelConfig& a, const ModelConfig& b);

}  // namespace tandem
