#include "tandem/model/model_family.h"

#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/json_keys.h"
#include "tandem/model/gpt.h"
#include "tandem/model/llama.h"

namespace tandem {
namespace {

using nlohmann::json;

template <typename Family>
std::unique_ptr<Model> make(const ModelConfig& config, ComputeBackend& backend, int B, int T,
                            StorageDType dtype, ModelOwnBuffers own) {
  return std::make_unique<Family>(config, backend, B, T, dtype, own);
}

// A key of a Hugging Face config.json, with the message for one that is missing or of the
// wrong type naming both.
template <typename T>
T hf_value(const json& hf, const char* key) {
  const auto it = hf.find(key);
  TANDEM_CHECK(it != hf.end() && !it->is_null(), "config.json has no \"", key,
               "\"; is this a Hugging Face model directory?");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail("config.json: \"", key, "\" = ", it->dump(), " is not a ",
         std::is_same_v<T, bool> ? "boolean" : "number");
  }
}

template <typename T>
T hf_value_or(const json& hf, const char* key, T fallback) {
  return hf.contains(key) && !hf[key].is_null() ? hf_value<T>(hf, key) : fallback;
}

json gpt2_to_hf(const ModelConfig& config) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", config.vocab_size},
          {"n_positions", config.context_length},
          {"n_ctx", config.context_length},
          {"n_embd", config.n_embd},
          {"n_layer", config.n_layer},
          {"n_head", config.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true},
          // GPT-2's <|endoftext|> where the vocabulary has it; none for smaller (byte-level)
          // ones, where transformers' default (50256) would name a token that does not exist.
          {"bos_token_id", config.vocab_size > 50256 ? json(50256) : json(nullptr)},
          {"eos_token_id", config.vocab_size > 50256 ? json(50256) : json(nullptr)},
          {"torch_dtype", "float32"}};
}

ModelConfig gpt2_from_hf(const json& hf) {
  ModelConfig config;
  config.type = ModelType::kGpt2;
  config.vocab_size = hf_value<int>(hf, "vocab_size");
  config.context_length = hf_value<int>(hf, "n_positions");
  config.n_embd = hf_value<int>(hf, "n_embd");
  config.n_layer = hf_value<int>(hf, "n_layer");
  config.n_head = hf_value<int>(hf, "n_head");
  const int inner = hf_value_or<int>(hf, "n_inner", 4 * config.n_embd);
  TANDEM_CHECK(inner == 4 * config.n_embd, "config.json: n_inner = ", inner,
               "; tandem's GPT-2 has an MLP of 4 * n_embd = ", 4 * config.n_embd);
  const std::string activation = hf.value("activation_function", std::string("gelu_new"));
  TANDEM_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh",
               "config.json: activation_function \"", activation,
               "\"; tandem's GPT-2 uses the tanh GELU (gelu_new)");
  TANDEM_CHECK(hf_value_or<bool>(hf, "tie_word_embeddings", true),
               "config.json: tie_word_embeddings false; tandem's GPT-2 ties its head");
  const double eps = hf_value_or<double>(hf, "layer_norm_epsilon", 1e-5);
  TANDEM_CHECK(eps == 1e-5, "config.json: layer_norm_epsilon = ", eps,
               "; tandem's GPT-2 LayerNorm uses 1e-5");
  config.validate();
  return config;
}

json llama_to_hf(const ModelConfig& config) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", config.vocab_size},
          {"max_position_embeddings", config.context_length},
          {"hidden_size", config.n_embd},
          {"intermediate_size", config.mlp_width()},
          {"num_hidden_layers", config.n_layer},
          {"num_attention_heads", config.n_head},
          {"num_key_value_heads", config.kv_heads()},
          {"head_dim", config.head_size()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", config.rms_norm_eps},
          {"rope_theta", config.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"attention_dropout", 0.0},
          {"initializer_range", 0.02},
          {"tie_word_embeddings", config.tie_word_embeddings},
          {"torch_dtype", "float32"}};
}

// A Llama's rotary base. transformers 4 writes rope_theta and rope_scaling at the top level;
// transformers 5 writes rope_parameters {rope_theta, rope_type, and the scaling's own
// keys}. tandem's rotary embeddings are the plain ones (rope_type "default"): any scaling
// (linear, dynamic, yarn, llama3, ...) is refused by name rather than silently ignored.
double llama_rope_theta(const json& hf) {
  // The rope type an object names (rope_type, or the older type); `unnamed` when it names none.
  const auto rope_type = [](const json& rope, const char* unnamed) {
    return rope.is_object() ? rope.value("rope_type", rope.value("type", std::string(unnamed)))
                            : std::string("not an object");
  };
  if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null())
    TANDEM_CHECK(rope_type(hf["rope_scaling"], "none") == "default", "config.json: rope_scaling ",
                 hf["rope_scaling"].dump(),
                 " is not supported; tandem's Llama uses plain rotary embeddings");
  double theta = hf_value_or<double>(hf, "rope_theta", 10000.0);
  if (hf.contains("rope_parameters") && !hf["rope_parameters"].is_null()) {
    const json& rope = hf["rope_parameters"];
    TANDEM_CHECK(rope_type(rope, "default") == "default", "config.json: rope_parameters ",
                 rope.dump(),
                 " is not supported; tandem's Llama uses plain rotary embeddings (rope_type "
                 "\"default\")");
    const double nested = hf_value_or<double>(rope, "rope_theta", theta);
    TANDEM_CHECK(!hf.contains("rope_theta") || hf["rope_theta"].is_null() || nested == theta,
                 "config.json: rope_theta = ", theta, " but rope_parameters.rope_theta = ", nested,
                 "; which one is the model's?");
    theta = nested;
  }
  return theta;
}

ModelConfig llama_from_hf(const json& hf) {
  ModelConfig config;
  config.type = ModelType::kLlama;
  config.vocab_size = hf_value<int>(hf, "vocab_size");
  config.context_length = hf_value<int>(hf, "max_position_embeddings");
  config.n_embd = hf_value<int>(hf, "hidden_size");
  config.intermediate_size = hf_value<int>(hf, "intermediate_size");
  config.n_layer = hf_value<int>(hf, "num_hidden_layers");
  config.n_head = hf_value<int>(hf, "num_attention_heads");
  config.n_kv_head = hf_value_or<int>(hf, "num_key_value_heads", config.n_head);
  config.rms_norm_eps = hf_value_or<double>(hf, "rms_norm_eps", 1e-6);
  config.rope_theta = llama_rope_theta(hf);
  config.tie_word_embeddings = hf_value_or<bool>(hf, "tie_word_embeddings", false);
  const std::string act = hf.value("hidden_act", std::string("silu"));
  TANDEM_CHECK(act == "silu", "config.json: hidden_act \"", act, "\"; tandem's Llama uses silu");
  TANDEM_CHECK(
      !hf_value_or<bool>(hf, "attention_bias", false) && !hf_value_or<bool>(hf, "mlp_bias", false),
      "config.json: attention_bias/mlp_bias true; tandem's Llama has no biases");
  if (hf.contains("head_dim") && !hf["head_dim"].is_null()) {
    const int head_dim = hf_value<int>(hf, "head_dim");
    TANDEM_CHECK(head_dim * config.n_head == config.n_embd, "config.json: head_dim = ", head_dim,
                 " but hidden_size / num_attention_heads = ", config.n_embd / config.n_head,
                 "; tandem needs head_dim * num_attention_heads = hidden_size");
  }
  config.validate();
  return config;
}

using ConfigKeys = JsonKeys<ModelConfig>;

// "type": read before the rest of the section, since it decides which keys the rest are.
ConfigKeys::Key model_type_key() {
  return {"type", [](const JsonSection&, ModelConfig&) {},
          [](const ModelConfig& m) { return json(std::string(model_type_name(m.type))); }};
}

// llm.c's names.
const std::vector<ConfigKeys::Key>& gpt2_config_keys() {
  static const std::vector<ConfigKeys::Key> keys = {
      model_type_key(),
      ConfigKeys::integer("vocab_size", TANDEM_FIELD(vocab_size), 1),
      ConfigKeys::integer("context_length", TANDEM_FIELD(context_length), 1),
      ConfigKeys::integer("n_layer", TANDEM_FIELD(n_layer), 1),
      ConfigKeys::integer("n_head", TANDEM_FIELD(n_head), 1),
      ConfigKeys::integer("n_embd", TANDEM_FIELD(n_embd), 1)};
  return keys;
}

// Hugging Face LlamaConfig's names.
const std::vector<ConfigKeys::Key>& llama_config_keys() {
  static const std::vector<ConfigKeys::Key> keys = [] {
    // Absent (0), these follow the others; written as what they came to.
    ConfigKeys::Key kv_heads =
        ConfigKeys::integer("num_key_value_heads", TANDEM_FIELD(n_kv_head), 1);
    kv_heads.write = [](const ModelConfig& m) { return json(m.kv_heads()); };
    ConfigKeys::Key mlp =
        ConfigKeys::integer("intermediate_size", TANDEM_FIELD(intermediate_size), 1);
    mlp.write = [](const ModelConfig& m) { return json(m.mlp_width()); };
    return std::vector<ConfigKeys::Key>{
        model_type_key(),
        ConfigKeys::integer("vocab_size", TANDEM_FIELD(vocab_size), 1),
        ConfigKeys::integer("max_position_embeddings", TANDEM_FIELD(context_length), 1),
        ConfigKeys::integer("hidden_size", TANDEM_FIELD(n_embd), 1),
        ConfigKeys::integer("num_hidden_layers", TANDEM_FIELD(n_layer), 1),
        ConfigKeys::integer("num_attention_heads", TANDEM_FIELD(n_head), 1),
        kv_heads,
        mlp,
        ConfigKeys::real("rms_norm_eps", TANDEM_FIELD(rms_norm_eps), "a number > 0",
                         [](double v) { return v > 0; }),
        ConfigKeys::real("rope_theta", TANDEM_FIELD(rope_theta), "a number > 1",
                         [](double v) { return v > 1; }),
        ConfigKeys::boolean("tie_word_embeddings", TANDEM_FIELD(tie_word_embeddings))};
  }();
  return keys;
}

ModelConfig gpt2_read_run_config(const JsonSection& section) {
  ModelConfig config;
  read_json_keys<ModelConfig>(section, gpt2_config_keys(), config);
  config.validate();
  return config;
}

json gpt2_write_run_config(const ModelConfig& config) {
  return write_json_keys<ModelConfig>(gpt2_config_keys(), config);
}

ModelConfig llama_read_run_config(const JsonSection& section) {
  ModelConfig config;
  config.type = ModelType::kLlama;
  config.tie_word_embeddings = false;  // Hugging Face LlamaConfig's defaults
  config.rms_norm_eps = 1e-6;
  read_json_keys<ModelConfig>(section, llama_config_keys(), config);
  if (config.n_kv_head == 0) config.n_kv_head = config.n_head;
  if (config.intermediate_size == 0) config.intermediate_size = 4 * config.n_embd;
  config.validate();
  return config;
}

json llama_write_run_config(const ModelConfig& config) {
  return write_json_keys<ModelConfig>(llama_config_keys(), config);
}

constexpr ModelFamily kFamilies[] = {
    {ModelType::kGpt2, "GPT2LMHeadModel", gpt2_layout, Gpt::activation_bytes, make<Gpt>, gpt2_to_hf,
     gpt2_from_hf, gpt2_read_run_config, gpt2_write_run_config},
    {ModelType::kLlama, "LlamaForCausalLM", llama_layout, Llama::activation_bytes, make<Llama>,
     llama_to_hf, llama_from_hf, llama_read_run_config, llama_write_run_config},
};

}  // namespace

const ModelFamily& model_family(ModelType type) {
  for (const ModelFamily& family : kFamilies)
    if (family.type == type) return family;
  fail("no model family for model.type ", static_cast<int>(type));
}

const ModelFamily& model_family_of_hf(std::string_view hf_model_type) {
  for (const ModelFamily& family : kFamilies)
    if (model_type_name(family.type) == hf_model_type) return family;
  fail("config.json: model_type \"", hf_model_type, "\" is not one tandem reads; it reads ",
       enum_names_list(kModelTypeNames, " and "));
}

}  // namespace tandem
