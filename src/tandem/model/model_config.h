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

// A model's type is the Hugging Face `model_type` its config.json carries. Every type but
// GPT-2 is a Llama with options (the Llama class: one forward and backward); the type
// decides the options' defaults and how config.json is written and read.
enum class ModelType {
  kGpt2,     // learned positions, LayerNorm, GELU MLP, biases, head tied to the embedding
  kLlama,    // rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention (Llama 2/3.x)
  kMistral,  // a Llama with an explicit head_dim and a sliding window (none shorter than T)
  kQwen2,    // a Llama with biases on q, k and v (Qwen2, Qwen2.5)
  kQwen3,    // a Llama with per-head RMSNorm on q and k before the rotation (Qwen3 dense)
};

inline constexpr EnumName<ModelType> kModelTypeNames[] = {{ModelType::kGpt2, "gpt2"},
                                                          {ModelType::kLlama, "llama"},
                                                          {ModelType::kMistral, "mistral"},
                                                          {ModelType::kQwen2, "qwen2"},
                                                          {ModelType::kQwen3, "qwen3"}};
constexpr std::string_view model_type_name(ModelType type) {  // "gpt2", "llama", ...
  return enum_name(kModelTypeNames, type);
}
// Whether the type is computed by the Llama class (every type but GPT-2).
constexpr bool is_llama_family(ModelType type) { return type != ModelType::kGpt2; }

// How rotary frequencies are scaled for a context longer than the model was trained on,
// as Hugging Face's rope_type names it: the plain frequencies, all divided by `factor`
// (linear), or Llama 3.1's bands (llama3: frequencies whose wavelength exceeds
// original_max_position_embeddings / low_freq_factor divided by `factor`, those under
// original / high_freq_factor kept, the band between blended).
enum class RopeType { kDefault, kLinear, kLlama3 };
inline constexpr EnumName<RopeType> kRopeTypeNames[] = {
    {RopeType::kDefault, "default"}, {RopeType::kLinear, "linear"}, {RopeType::kLlama3, "llama3"}};

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  double factor = 1.0;                       // linear, llama3
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  int original_max_position_embeddings = 0;  // llama3: the context before the scaling
  bool operator==(const RopeScaling&) const = default;
};
// Throws tandem::Error naming the known types.
ModelType parse_model_type(std::string_view name);

struct ModelConfig {
  ModelType type = ModelType::kGpt2;
  int vocab_size = 256;      // V: number of token ids
  int context_length = 256;  // maxT: positions (GPT-2's wpe rows; Llama's RoPE table)
  int n_layer = 6;           // L: transformer blocks
  int n_head = 6;            // NH: query heads; n_embd % n_head == 0
  int n_embd = 384;          // C: channels
  // The Llama family (Hugging Face config names in the JSON config). For GPT-2 these are
  // NH, 4C, unused, unused, true, C / NH and the rest off.
  int n_kv_head = 0;                // KVH: key/value heads (num_key_value_heads); 0 = n_head
  int intermediate_size = 0;        // I: SwiGLU width; 0 = 4C (GPT-2's MLP width)
  double rms_norm_eps = 1e-5;       // added to the mean square before its inverse root
  double rope_theta = 10000.0;      // RoPE base
  bool tie_word_embeddings = true;  // the LM head is the token embedding (GPT-2: always)
  int head_dim = 0;                 // HS (head_dim); 0 = n_embd / n_head
  bool qkv_bias = false;            // q, k and v projections have biases (Qwen2)
  bool o_bias = false;              // the output projection has one (attention_bias: with qkv)
  bool qk_norm = false;             // RMSNorm of each q and k head before RoPE (Qwen3)
  int sliding_window = 0;           // attention window (Mistral); 0 = none. Never applied:
                                    // a model is refused a sequence longer than it.
  RopeScaling rope_scaling{};

  int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int mlp_width() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  // Columns of the attention's output (NH * head size; C unless head_dim says otherwise).
  int attention_width() const { return n_head * head_size(); }
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
