#include "tandem/model/model_family.h"

#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
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

// A head_dim that is hidden_size / num_attention_heads is kept as 0 (derived), so a model
// read with the key and one read without it are the same config.
void normalize_head_dim(ModelConfig& config) {
  if (config.head_dim != 0 && config.n_embd % config.n_head == 0 &&
      config.head_dim == config.n_embd / config.n_head)
    config.head_dim = 0;
}

// Which options a type of the Llama family has (model_config.h): the biases and norms are
// the type's, fixed, except Llama's and Qwen3's attention_bias; Mistral has no biases.
void check_llama_type_options(const ModelConfig& config) {
  const std::string_view type = model_type_name(config.type);
  switch (config.type) {
    case ModelType::kQwen2:
      TANDEM_CHECK(config.qkv_bias && !config.o_bias && !config.qk_norm,
                   "a qwen2 model has biases on q, k and v only, and no q/k norms");
      break;
    case ModelType::kQwen3:
      TANDEM_CHECK(config.qk_norm && config.qkv_bias == config.o_bias,
                   "a qwen3 model has q/k norms, and attention_bias puts biases on q, k, v and o");
      break;
    case ModelType::kMistral:
      TANDEM_CHECK(!config.qkv_bias && !config.o_bias && !config.qk_norm,
                   "a mistral model has no attention biases and no q/k norms");
      break;
    default:
      TANDEM_CHECK(!config.qk_norm && config.qkv_bias == config.o_bias, "a ", type,
                   " model has no q/k norms, and attention_bias puts biases on q, k, v and o");
  }
  TANDEM_CHECK(config.sliding_window == 0 || config.type == ModelType::kMistral, "a ", type,
               " model has no sliding window here (use_sliding_window is refused)");
}

json rope_scaling_to_hf(const RopeScaling& rope) {
  switch (rope.type) {
    case RopeType::kDefault:
      return nullptr;
    case RopeType::kLinear:
      return {{"rope_type", "linear"}, {"factor", rope.factor}};
    case RopeType::kLlama3:
      return {{"rope_type", "llama3"},
              {"factor", rope.factor},
              {"low_freq_factor", rope.low_freq_factor},
              {"high_freq_factor", rope.high_freq_factor},
              {"original_max_position_embeddings", rope.original_max_position_embeddings}};
  }
  return nullptr;
}

// config.json of a model of the Llama family, as transformers 4 writes it (rope_theta and
// rope_scaling at the top level, which transformers 5 reads too), with the keys of its type.
json llama_family_to_hf(const ModelConfig& config) {
  const ModelFamily& family = model_family(config.type);
  json hf = {{"architectures", {family.hf_architecture}},
             {"model_type", model_type_name(config.type)},
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
             {"rope_scaling", rope_scaling_to_hf(config.rope_scaling)},
             {"attention_dropout", 0.0},
             {"initializer_range", 0.02},
             {"tie_word_embeddings", config.tie_word_embeddings},
             {"torch_dtype", "float32"}};
  switch (config.type) {
    case ModelType::kMistral:
      hf["sliding_window"] = config.sliding_window > 0 ? json(config.sliding_window) : json();
      break;
    case ModelType::kQwen2:
    case ModelType::kQwen3:
      hf["use_sliding_window"] = false;
      hf["sliding_window"] = nullptr;
      hf["max_window_layers"] = config.n_layer;
      if (config.type == ModelType::kQwen3) hf["attention_bias"] = config.o_bias;
      break;
    default:
      hf["attention_bias"] = config.o_bias;
      hf["mlp_bias"] = false;
  }
  return hf;
}

// The rotary base and scaling. transformers 4 writes rope_theta and rope_scaling at the top
// level; transformers 5 writes rope_parameters {rope_theta, rope_type, and the scaling's
// own keys}. What tandem does not compute (dynamic, yarn, longrope, ...) is refused by name
// rather than read as the plain rotation.
void read_hf_rope(const json& hf, ModelConfig& config) {
  const auto rope_of = [&](const char* key, const json& rope) {
    TANDEM_CHECK(rope.is_object(), "config.json: ", key, " = ", rope.dump(),
                 " is not an object of rotary parameters");
    const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
    RopeScaling scaling;
    if (type == "default") return scaling;
    if (type == "linear") {
      scaling.type = RopeType::kLinear;
      scaling.factor = hf_value<double>(rope, "factor");
    } else if (type == "llama3") {
      scaling.type = RopeType::kLlama3;
      scaling.factor = hf_value<double>(rope, "factor");
      scaling.low_freq_factor = hf_value<double>(rope, "low_freq_factor");
      scaling.high_freq_factor = hf_value<double>(rope, "high_freq_factor");
      scaling.original_max_position_embeddings =
          hf_value<int>(rope, "original_max_position_embeddings");
    } else {
      fail("config.json: ", key, " has rope_type \"", type,
           "\", which tandem does not compute; it computes \"default\", \"linear\" and "
           "\"llama3\" rotary embeddings");
    }
    return scaling;
  };
  config.rope_theta = hf_value_or<double>(hf, "rope_theta", 10000.0);
  if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null())
    config.rope_scaling = rope_of("rope_scaling", hf["rope_scaling"]);
  if (hf.contains("rope_parameters") && !hf["rope_parameters"].is_null()) {
    const json& rope = hf["rope_parameters"];
    const RopeScaling nested = rope_of("rope_parameters", rope);
    TANDEM_CHECK(!hf.contains("rope_scaling") || hf["rope_scaling"].is_null() ||
                     nested == config.rope_scaling,
                 "config.json: rope_scaling ", hf["rope_scaling"].dump(), " and rope_parameters ",
                 rope.dump(), " disagree; which one is the model's?");
    config.rope_scaling = nested;
    const double theta = hf_value_or<double>(rope, "rope_theta", config.rope_theta);
    TANDEM_CHECK(
        !hf.contains("rope_theta") || hf["rope_theta"].is_null() || theta == config.rope_theta,
        "config.json: rope_theta = ", config.rope_theta,
        " but rope_parameters.rope_theta = ", theta, "; which one is the model's?");
    config.rope_theta = theta;
  }
}

// A sliding window: Mistral's applies to every layer; Qwen's only with use_sliding_window
// (refused: tandem's attention has no window), where transformers 5 also lists layer_types.
int read_hf_sliding_window(const json& hf, ModelType type) {
  if (type == ModelType::kMistral) return hf_value_or<int>(hf, "sliding_window", 0);
  TANDEM_CHECK(!hf_value_or<bool>(hf, "use_sliding_window", false),
               "config.json: use_sliding_window true; tandem's attention has no window, so it "
               "does not compute this model");
  if (hf.contains("layer_types") && hf["layer_types"].is_array())
    for (const json& layer : hf["layer_types"])
      TANDEM_CHECK(layer == "full_attention", "config.json: layer_types holds ", layer.dump(),
                   "; tandem computes full attention only");
  return 0;
}

ModelConfig llama_family_from_hf(const json& hf, ModelType type) {
  ModelConfig config;
  config.type = type;
  config.vocab_size = hf_value<int>(hf, "vocab_size");
  config.context_length = hf_value<int>(hf, "max_position_embeddings");
  config.n_embd = hf_value<int>(hf, "hidden_size");
  config.intermediate_size = hf_value<int>(hf, "intermediate_size");
  config.n_layer = hf_value<int>(hf, "num_hidden_layers");
  config.n_head = hf_value<int>(hf, "num_attention_heads");
  config.n_kv_head = hf_value_or<int>(hf, "num_key_value_heads", config.n_head);
  config.rms_norm_eps = hf_value_or<double>(hf, "rms_norm_eps", 1e-6);
  config.tie_word_embeddings = hf_value_or<bool>(hf, "tie_word_embeddings", false);
  // Qwen3Config's head_dim defaults to 128; the others' to hidden_size / heads.
  const int derived_head_dim = config.n_embd / config.n_head;
  config.head_dim =
      hf_value_or<int>(hf, "head_dim", type == ModelType::kQwen3 ? 128 : derived_head_dim);
  normalize_head_dim(config);
  read_hf_rope(hf, config);
  const std::string act = hf.value("hidden_act", std::string("silu"));
  TANDEM_CHECK(act == "silu", "config.json: hidden_act \"", act, "\"; tandem's ",
               model_type_name(type), " uses silu");
  TANDEM_CHECK(!hf_value_or<bool>(hf, "mlp_bias", false),
               "config.json: mlp_bias true; tandem's MLP has no biases");
  switch (type) {
    case ModelType::kQwen2:
      config.qkv_bias = true;
      break;
    case ModelType::kQwen3:
      config.qk_norm = true;
      config.qkv_bias = config.o_bias = hf_value_or<bool>(hf, "attention_bias", false);
      break;
    case ModelType::kMistral:
      break;
    default:
      config.qkv_bias = config.o_bias = hf_value_or<bool>(hf, "attention_bias", false);
  }
  config.sliding_window = read_hf_sliding_window(hf, type);
  check_llama_type_options(config);
  config.validate();
  return config;
}

template <ModelType kType>
ModelConfig llama_family_from_hf_of(const json& hf) {
  return llama_family_from_hf(hf, kType);
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

// The Llama family's: Hugging Face's config names, each type with the keys its config has.
std::vector<ConfigKeys::Key> llama_family_config_keys(ModelType type) {
  // Absent (0), these follow the others; written as what they came to.
  ConfigKeys::Key kv_heads = ConfigKeys::integer("num_key_value_heads", TANDEM_FIELD(n_kv_head), 1);
  kv_heads.write = [](const ModelConfig& m) { return json(m.kv_heads()); };
  ConfigKeys::Key mlp =
      ConfigKeys::integer("intermediate_size", TANDEM_FIELD(intermediate_size), 1);
  mlp.write = [](const ModelConfig& m) { return json(m.mlp_width()); };
  ConfigKeys::Key head_dim = ConfigKeys::integer("head_dim", TANDEM_FIELD(head_dim), 2);
  head_dim.write = [](const ModelConfig& m) { return json(m.head_size()); };
  // Written only where the rotation is scaled.
  ConfigKeys::Key rope_scaling = ConfigKeys::section(
      "rope_scaling",
      {ConfigKeys::choice("rope_type", TANDEM_FIELD(rope_scaling.type), kRopeTypeNames),
       ConfigKeys::real("factor", TANDEM_FIELD(rope_scaling.factor), "a number > 0",
                        [](double v) { return v > 0; }),
       ConfigKeys::real("low_freq_factor", TANDEM_FIELD(rope_scaling.low_freq_factor),
                        "a number > 0", [](double v) { return v > 0; }),
       ConfigKeys::real("high_freq_factor", TANDEM_FIELD(rope_scaling.high_freq_factor),
                        "a number > 0", [](double v) { return v > 0; }),
       ConfigKeys::integer("original_max_position_embeddings",
                           TANDEM_FIELD(rope_scaling.original_max_position_embeddings), 1)});
  rope_scaling.write = [write = rope_scaling.write](const ModelConfig& m) {
    return m.rope_scaling.type == RopeType::kDefault ? json() : write(m);
  };
  std::vector<ConfigKeys::Key> keys = {
      model_type_key(),
      ConfigKeys::integer("vocab_size", TANDEM_FIELD(vocab_size), 1),
      ConfigKeys::integer("max_position_embeddings", TANDEM_FIELD(context_length), 1),
      ConfigKeys::integer("hidden_size", TANDEM_FIELD(n_embd), 1),
      ConfigKeys::integer("num_hidden_layers", TANDEM_FIELD(n_layer), 1),
      ConfigKeys::integer("num_attention_heads", TANDEM_FIELD(n_head), 1),
      kv_heads,
      head_dim,
      mlp,
      ConfigKeys::real("rms_norm_eps", TANDEM_FIELD(rms_norm_eps), "a number > 0",
                       [](double v) { return v > 0; }),
      ConfigKeys::real("rope_theta", TANDEM_FIELD(rope_theta), "a number > 1",
                       [](double v) { return v > 1; }),
      rope_scaling,
      ConfigKeys::boolean("tie_word_embeddings", TANDEM_FIELD(tie_word_embeddings))};
  if (type == ModelType::kLlama || type == ModelType::kQwen3) {
    // Biases on q, k, v and o together.
    ConfigKeys::Key bias = ConfigKeys::boolean("attention_bias", TANDEM_FIELD(o_bias));
    bias.read = [read = bias.read](const JsonSection& s, ModelConfig& m) {
      read(s, m);
      m.qkv_bias = m.o_bias;
    };
    keys.push_back(bias);
  }
  if (type == ModelType::kMistral) {
    ConfigKeys::Key window = ConfigKeys::integer("sliding_window", TANDEM_FIELD(sliding_window), 0);
    window.write = [](const ModelConfig& m) {
      return m.sliding_window > 0 ? json(m.sliding_window) : json();
    };
    keys.push_back(window);
  }
  return keys;
}

const std::vector<ConfigKeys::Key>& llama_family_keys(ModelType type) {
  static const std::vector<ConfigKeys::Key> llama = llama_family_config_keys(ModelType::kLlama),
                                            mistral = llama_family_config_keys(ModelType::kMistral),
                                            qwen2 = llama_family_config_keys(ModelType::kQwen2),
                                            qwen3 = llama_family_config_keys(ModelType::kQwen3);
  switch (type) {
    case ModelType::kMistral:
      return mistral;
    case ModelType::kQwen2:
      return qwen2;
    case ModelType::kQwen3:
      return qwen3;
    default:
      return llama;
  }
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

// A model of the Llama family from the run config: Hugging Face's defaults for the type
// (untied head, rms_norm_eps 1e-6, the type's biases and norms), then the section's keys.
template <ModelType kType>
ModelConfig llama_family_read_run_config(const JsonSection& section) {
  ModelConfig config;
  config.type = kType;
  config.tie_word_embeddings = false;
  config.rms_norm_eps = 1e-6;
  config.qkv_bias = kType == ModelType::kQwen2;
  config.qk_norm = kType == ModelType::kQwen3;
  read_json_keys<ModelConfig>(section, llama_family_keys(kType), config);
  if (config.n_kv_head == 0) config.n_kv_head = config.n_head;
  if (config.intermediate_size == 0) config.intermediate_size = 4 * config.n_embd;
  normalize_head_dim(config);
  check_llama_type_options(config);
  config.validate();
  return config;
}

json llama_family_write_run_config(const ModelConfig& config) {
  return write_json_keys<ModelConfig>(llama_family_keys(config.type), config);
}

// One row per Hugging Face model_type; the Llama family's rows share the Llama class.
template <ModelType kType>
constexpr ModelFamily llama_family_row(std::string_view hf_architecture) {
  return {kType,
          hf_architecture,
          llama_layout,
          Llama::activation_bytes,
          make<Llama>,
          llama_family_to_hf,
          llama_family_from_hf_of<kType>,
          llama_family_read_run_config<kType>,
          llama_family_write_run_config};
}

constexpr ModelFamily kFamilies[] = {
    {ModelType::kGpt2, "GPT2LMHeadModel", gpt2_layout, Gpt::activation_bytes, make<Gpt>, gpt2_to_hf,
     gpt2_from_hf, gpt2_read_run_config, gpt2_write_run_config},
    llama_family_row<ModelType::kLlama>("LlamaForCausalLM"),
    llama_family_row<ModelType::kMistral>("MistralForCausalLM"),
    llama_family_row<ModelType::kQwen2>("Qwen2ForCausalLM"),
    llama_family_row<ModelType::kQwen3>("Qwen3ForCausalLM"),
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

ModelConfig read_hf_model_config(const std::filesystem::path& dir, std::string_view option) {
  const std::string where = cat(option, " ", dir.string(), ": ");
  TANDEM_CHECK(std::filesystem::is_directory(dir), where,
               "not a directory; name a Hugging Face model directory (what save_pretrained "
               "writes: config.json and model.safetensors)");
  TANDEM_CHECK(std::filesystem::exists(dir / "config.json"), where,
               "no config.json; name a Hugging Face model directory (what save_pretrained "
               "writes: config.json and model.safetensors)");
  try {
    const nlohmann::json hf = nlohmann::json::parse(read_file_text(dir / "config.json"));
    return model_family_of_hf(hf.value("model_type", std::string())).from_hf_config(hf);
  } catch (const nlohmann::json::exception& e) {
    fail(where, "config.json is not valid JSON (", e.what(), ")");
  } catch (const Error& e) {
    fail(where, e.what());
  }
}

}  // namespace tandem
