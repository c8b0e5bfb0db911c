// The run configuration: JSON -> TrainConfig and back, with messages that say which key is
// wrong and what would be right. A config file is the one input every user writes by hand,
// so every mistake in it should be reported here, once, before any data is loaded.
//
// Keys named "$schema", "comment" and "_comment" are accepted and ignored at any level, so
// that files can point at a JSON schema and carry notes (JSON has no comments).

#include "tandem/train/train_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {

using json = nlohmann::json;

namespace {

// A list of allowed keys, in the order they are listed in messages.
using Keys = std::span<const std::string_view>;

constexpr std::string_view kTopKeys[] = {"model",
                                         "data",
                                         "train_micro_batch_size_per_gpu",
                                         "gradient_accumulation_steps",
                                         "gradient_clipping",
                                         "optimizer",
                                         "demo",
                                         "scheduler",
                                         "zero_optimization",
                                         "offload_optimizer",
                                         "device",
                                         "bf16",
                                         "train"};
constexpr std::string_view kZeroKeys[] = {"stage",
                                          "sub_group_size",
                                          "overlap_comm",
                                          "contiguous_gradients",
                                          "reduce_bucket_size",
                                          "allgather_bucket_size",
                                          "stage3_prefetch_bucket_size",
                                          "stage3_param_persistence_threshold",
                                          "stage3_max_live_parameters"};
constexpr std::string_view kOffloadKeys[] = {"schedule", "ratio", "stride", "staging_buffers"};
constexpr std::string_view kDeviceKeys[] = {"type", "memory_gb"};
constexpr std::string_view kSchedules[] = {"device", "cpu", "ratio", "interleave", "auto"};
constexpr std::string_view kDeviceTypes[] = {"cpu", "cuda"};
constexpr std::string_view kBf16Keys[] = {"enabled"};
constexpr std::string_view kGpt2ModelKeys[] = {"type",    "vocab_size", "context_length",
                                               "n_layer", "n_head",     "n_embd"};
// Hugging Face LlamaConfig's names.
constexpr std::string_view kLlamaModelKeys[] = {"type",
                                                "vocab_size",
                                                "max_position_embeddings",
                                                "hidden_size",
                                                "num_hidden_layers",
                                                "num_attention_heads",
                                                "num_key_value_heads",
                                                "intermediate_size",
                                                "rms_norm_eps",
                                                "rope_theta",
                                                "tie_word_embeddings"};
constexpr std::string_view kDataKeys[] = {"train_path", "val_path", "val_fraction"};
constexpr std::string_view kTypedKeys[] = {"type", "params"};
constexpr std::string_view kAdamWParamKeys[] = {"lr", "betas", "eps", "weight_decay"};
constexpr std::string_view kDemoParamKeys[] = {"lr",
                                               "compression_decay",
                                               "compression_topk",
                                               "compression_chunk",
                                               "compression_values",
                                               "weight_decay"};
// Every key of either type: what may be written one level too high.
constexpr std::string_view kOptimizerParamKeys[] = {"lr",
                                                    "betas",
                                                    "eps",
                                                    "weight_decay",
                                                    "compression_decay",
                                                    "compression_topk",
                                                    "compression_chunk",
                                                    "compression_values"};
constexpr std::string_view kDemoKeys[] = {"replica_check_interval"};
constexpr std::string_view kSchedulerParamKeys[] = {"warmup_num_steps", "cos_min_ratio"};
constexpr std::string_view kTrainKeys[] = {"steps",
                                           "seed",
                                           "seq_len",
                                           "eval_interval",
                                           "eval_batches",
                                           "checkpoint_interval",
                                           "log_interval",
                                           "output_dir",
                                           "sample_bytes",
                                           "init_from",
                                           "max_shard_size",
                                           "lazy_checkpoints",
                                           "keep_checkpoints",
                                           "checkpoint_memory_mb",
                                           "max_skipped_steps",
                                           "checkpoint_failure"};

constexpr std::string_view kSchedulerType = "WarmupCosineLR";

bool is_ignored_key(std::string_view key) {
  return key == "$schema" || key == "comment" || key == "_comment";
}

std::string join(Keys keys) {
  std::string out;
  for (std::string_view key : keys) {
    if (!out.empty()) out += ", ";
    out += key;
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Edit distance, case-insensitive, a swap of two neighbours one edit (optimal string
// alignment): "LR" and "lrr" are both one slip from "lr", "stpes" one from "steps".
size_t edit_distance(std::string_view a_in, std::string_view b_in) {
  const std::string a = lower(a_in), b = lower(b_in);
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The allowed key nearest to `key`, or "" when none is near enough to be a likely typo
// (a third of the key's length, at least one edit: "lrr" -> "lr", "warmup_steps" ->
// "warmup_num_steps"), or the one allowed key it begins ("train_micro_batch_size" ->
// "train_micro_batch_size_per_gpu").
std::string closest_key(std::string_view key, Keys allowed) {
  const size_t limit = std::max<size_t>(1, key.size() / 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (std::string_view candidate : allowed) {
    const size_t d = edit_distance(key, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  }
  if (!best.empty() || key.size() < 4) return best;
  std::string extended;
  for (std::string_view candidate : allowed) {
    if (!lower(candidate).starts_with(lower(key))) continue;
    if (!extended.empty()) return "";  // more than one: no guess
    extended = candidate;
  }
  return extended;
}

std::string join_path(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : cat(prefix, '.', key);
}

// The found value as the user wrote it, shortened, with its JSON type:
// "\"100\" (a string)", "[1,2] (an array)".
std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  switch (value.type()) {
    case json::value_t::string:
      return text + " (a string)";
    case json::value_t::boolean:
      return text + " (a boolean)";
    case json::value_t::array:
      return text + " (an array)";
    case json::value_t::object:
      return text + " (an object)";
    case json::value_t::null:
      return text;
    default:
      return text;
  }
}

// A JSON object and its dotted path ("optimizer.params"); readers for each kind of field.
// Every reader leaves the field's default alone when the key is absent.
class Section {
 public:
  Section(const json* object, std::string path) : object_(object), path_(std::move(path)) {}

  // Refuses keys outside `allowed`. `child`/`child_keys` name a nested section whose keys
  // are sometimes written one level too high ("optimizer": {"lr": ...}).
  void check_keys(Keys allowed, std::string_view child = {}, Keys child_keys = {}) const {
    if (object_ == nullptr) return;
    for (const auto& [key, value] : object_->items()) {
      if (is_ignored_key(key) || std::find(allowed.begin(), allowed.end(), key) != allowed.end())
        continue;
      std::string hint;
      if (std::find(child_keys.begin(), child_keys.end(), key) != child_keys.end()) {
        hint = cat("; did you mean '", join_path(join_path(path_, child), key), "'?");
      } else if (std::string near = closest_key(key, allowed); !near.empty()) {
        hint = cat("; did you mean '", near, "'?");
      }
      fail("unknown key '", join_path(path_, key), "'", hint.empty() ? ";" : hint,
           " allowed keys: ", join(allowed));
    }
  }

  // The nested object at `key` (a section with no object when the key is absent).
  Section section(std::string_view key) const {
    const json* value = find(key);
    if (value != nullptr && !value->is_object())
      fail(path(key), " must be an object, got ", describe(*value));
    return Section(value, path(key));
  }

  // An integer in [min, max]; 100.0 counts as 100, 100.5 does not.
  template <typename Int>
  void read_int(std::string_view key, Int& out, int64_t min,
                int64_t max = std::numeric_limits<Int>::max(),
                std::string_view description = {}) const {
    const json* value = find(key);
    if (value == nullptr) return;
    const std::string wanted =
        description.empty() ? int_description(min, max) : std::string(description);
    int64_t v = 0;
    bool beyond_int64 = false;  // above any max: said by the range check below, once
    if (value->is_number_integer() && !value->is_number_unsigned()) {
      v = value->get<int64_t>();
    } else if (value->is_number_unsigned()) {
      // Beyond int64: above any max, which the range check below says (once).
      const uint64_t u = value->get<uint64_t>();
      beyond_int64 = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      v = beyond_int64 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(u);
    } else if (value->is_number_float()) {
      const double d = value->get<double>();
      if (std::trunc(d) != d) fail(path(key), " must be ", wanted, ", got ", value->dump());
      // 2^63 is exactly representable; anything at or beyond it cannot be an int64 (the
      // conversion would be undefined): it is above any max, which the range check says.
      if (d < -9223372036854775808.0) fail(path(key), " must be ", wanted, ", got ", value->dump());
      beyond_int64 = d >= 9223372036854775808.0;
      v = beyond_int64 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(d);
    } else {
      fail(path(key), " must be ", wanted, ", got ", describe(*value));
    }
    if (beyond_int64 || v < min || v > max) {
      // "a positive integer" does not say why 3000000000 is refused for an int field.
      const bool max_unsaid = wanted.find(std::to_string(max)) == std::string::npos;
      fail(path(key), " must be ", wanted,
           max_unsaid && (beyond_int64 || v > max) ? cat(" (at most ", max, ")") : "", ", got ",
           value->dump());
    }
    out = static_cast<Int>(v);
  }

  void read_uint64(std::string_view key, uint64_t& out) const {
    const json* value = find(key);
    if (value == nullptr) return;
    constexpr const char* kWanted = " must be an unsigned 64-bit integer (0 to 2^64-1), got ";
    if (value->is_number_unsigned()) {
      out = value->get<uint64_t>();
    } else if (value->is_number_integer()) {
      // Parsed text gives non-negative integers as unsigned, but JSON built in code
      // (nlohmann::json{{"seed", 7}}) holds them as signed.
      const int64_t v = value->get<int64_t>();
      if (v < 0) fail(path(key), kWanted, value->dump());
      out = static_cast<uint64_t>(v);
    } else if (value->is_number_float()) {
      const double d = value->get<double>();
      if (!(std::trunc(d) == d && d >= 0 && d < 18446744073709551616.0))
        fail(path(key), kWanted, value->dump());
      out = static_cast<uint64_t>(d);
    } else {
      fail(path(key), kWanted, describe(*value));
    }
  }

  // A finite number accepted by `ok`; `wanted` says what `ok` accepts ("a number > 0").
  // For float fields the check applies to the value after rounding to float, so that 1e-50
  // (0 as a float) is refused as an eps and 1e39 (inf) as an lr.
  template <typename Real, typename Ok>
  void read_real(std::string_view key, Real& out, std::string_view wanted, Ok ok) const {
    const json* value = find(key);
    if (value == nullptr) return;
    out = real_value<Real>(*value, path(key), wanted, ok);
  }

  void read_bool(std::string_view key, bool& out) const {
    const json* value = find(key);
    if (value == nullptr) return;
    if (!value->is_boolean()) fail(path(key), " must be true or false, got ", describe(*value));
    out = value->get<bool>();
  }

  std::string read_string(std::string_view key, std::string& out) const {
    const json* value = find(key);
    if (value == nullptr) return out;
    if (!value->is_string()) fail(path(key), " must be a string, got ", describe(*value));
    out = value->get<std::string>();
    return out;
  }

  // Reads "type" and checks it (case-insensitively) against the one supported value.
  void read_type(std::string_view supported) const {
    const json* value = find("type");
    if (value == nullptr) return;
    if (!value->is_string() || lower(value->get<std::string>()) != lower(supported))
      fail(path("type"), " must be one of: \"", supported, "\"; got ", describe(*value));
  }

  template <typename Real, typename Ok>
  static Real real_value(const json& value, const std::string& where, std::string_view wanted,
                         Ok ok) {
    if (!value.is_number()) fail(where, " must be ", wanted, ", got ", describe(value));
    const double d = value.get<double>();
    // Out-of-range double -> float conversion is undefined, so the range is checked first.
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<Real>::max())
      fail(where, " must be ", wanted, ", got ", value.dump());
    const Real v = static_cast<Real>(d);
    if (!ok(static_cast<double>(v))) fail(where, " must be ", wanted, ", got ", value.dump());
    return v;
  }

  const json* find(std::string_view key) const {
    if (object_ == nullptr) return nullptr;
    const auto it = object_->find(key);
    return it == object_->end() ? nullptr : &*it;
  }
  std::string path(std::string_view key) const { return join_path(path_, key); }

 private:
  static std::string int_description(int64_t min, int64_t max) {
    if (max == std::numeric_limits<int64_t>::max() || max == std::numeric_limits<int>::max()) {
      if (min == 1) return "a positive integer";
      if (min == 0) return "a non-negative integer";
      return cat("an integer >= ", min);
    }
    return cat("an integer in [", min, ", ", max, "]");
  }

  const json* object_;
  std::string path_;
};

// The shortest decimal that reads back as the same float ("0.95", not 0.949999988079071),
// so that a written config is both exact and readable. parse_train_config reads it as a
// double and rounds to float; that double rounding is checked, with the exact double
// value as the fallback.
json float_json(float f) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), f);
  const double shortest = std::strtod(std::string(buffer, result.ptr).c_str(), nullptr);
  if (static_cast<float>(shortest) == f) return shortest;
  return static_cast<double>(f);
}

json optimizer_json(const OptimizerConfig& o) {
  if (o.type == OptimizerType::kDeMo)
    return {{"type", "DeMo"},
            {"params",
             {{"lr", o.lr},
              {"compression_decay", float_json(o.compression_decay)},
              {"compression_topk", o.compression_topk},
              {"compression_chunk", o.compression_chunk},
              {"compression_values", std::string(demo_value_format_name(o.compression_values))},
              {"weight_decay", o.weight_decay}}}};
  return {{"type", "AdamW"},
          {"params",
           {{"lr", o.lr},
            {"betas", json::array({float_json(o.beta1), float_json(o.beta2)})},
            {"eps", float_json(o.eps)},
            {"weight_decay", o.weight_decay}}}};
}

}  // namespace

std::string_view optimizer_type_name(OptimizerType type) {
  return type == OptimizerType::kDeMo ? "DeMo" : "AdamW";
}

TrainConfig parse_train_config(const json& config_json) {
  if (!config_json.is_object())
    fail("the configuration must be a JSON object ({...}), got ", describe(config_json));
  TrainConfig config;
  const Section top(&config_json, "");
  top.check_keys(kTopKeys);

  const Section model = top.section("model");
  ModelConfig& m = config.model;
  std::string type = "gpt2";
  m.type = parse_model_type(lower(model.read_string("type", type)));
  if (m.type == ModelType::kGpt2) {
    model.check_keys(kGpt2ModelKeys);
    model.read_int("vocab_size", m.vocab_size, 1);
    model.read_int("context_length", m.context_length, 1);
    model.read_int("n_layer", m.n_layer, 1);
    model.read_int("n_head", m.n_head, 1);
    model.read_int("n_embd", m.n_embd, 1);
  } else {
    model.check_keys(kLlamaModelKeys);
    m.tie_word_embeddings = false;  // Hugging Face LlamaConfig's defaults
    m.rms_norm_eps = 1e-6;
    model.read_int("vocab_size", m.vocab_size, 1);
    model.read_int("max_position_embeddings", m.context_length, 1);
    model.read_int("hidden_size", m.n_embd, 1);
    model.read_int("num_hidden_layers", m.n_layer, 1);
    model.read_int("num_attention_heads", m.n_head, 1);
    model.read_int("num_key_value_heads", m.n_kv_head, 1);
    model.read_int("intermediate_size", m.intermediate_size, 1);
    model.read_real("rms_norm_eps", m.rms_norm_eps, "a number > 0", [](double v) { return v > 0; });
    model.read_real("rope_theta", m.rope_theta, "a number > 1", [](double v) { return v > 1; });
    model.read_bool("tie_word_embeddings", m.tie_word_embeddings);
    if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
    if (m.intermediate_size == 0) m.intermediate_size = 4 * m.n_embd;
  }
  m.validate();

  const Section data = top.section("data");
  data.check_keys(kDataKeys);
  TANDEM_CHECK(data.find("train_path") != nullptr,
               "data.train_path is required (a text file or an llm.c token shard *.bin), e.g. "
               "\"data\": {\"train_path\": \"data/tinyshakespeare.txt\"}");
  TANDEM_CHECK(!data.read_string("train_path", config.data.train_path).empty(),
               "data.train_path must not be empty");
  data.read_string("val_path", config.data.val_path);
  if (config.data.val_path.empty()) {
    data.read_real("val_fraction", config.data.val_fraction,
                   "a number in (0, 1) when data.val_path is empty",
                   [](double v) { return v > 0 && v < 1; });
  } else {
    // Unused with a separate validation file, but still held to a sane range.
    data.read_real("val_fraction", config.data.val_fraction, "a number in [0, 1)",
                   [](double v) { return v >= 0 && v < 1; });
  }

  top.read_int("train_micro_batch_size_per_gpu", config.micro_batch_size, 1);
  top.read_int("gradient_accumulation_steps", config.gradient_accumulation_steps, 1);
  top.read_real("gradient_clipping", config.gradient_clipping, "a number >= 0 (0 disables)",
                [](double v) { return v >= 0; });

  const Section optimizer = top.section("optimizer");
  optimizer.check_keys(kTypedKeys, "params", kOptimizerParamKeys);
  OptimizerConfig& o = config.optimizer;
  if (const json* type = optimizer.find("type")) {
    const std::string name = type->is_string() ? lower(type->get<std::string>()) : "";
    if (name == "adamw") {
      o.type = OptimizerType::kAdamW;
    } else if (name == "demo") {
      o.type = OptimizerType::kDeMo;
    } else {
      fail("optimizer.type must be one of: \"AdamW\", \"DeMo\"; got ", describe(*type));
    }
  }
  const bool demo = o.type == OptimizerType::kDeMo;
  if (demo) o.weight_decay = 0.0;
  const Section opt = optimizer.section("params");
  const Keys own = demo ? Keys(kDemoParamKeys) : Keys(kAdamWParamKeys);
  const Keys other = demo ? Keys(kAdamWParamKeys) : Keys(kDemoParamKeys);
  for (std::string_view key : other)
    if (std::find(own.begin(), own.end(), key) == own.end() && opt.find(key) != nullptr)
      fail(opt.path(key), " is a parameter of optimizer.type ", demo ? "AdamW" : "DeMo",
           ", not of ", optimizer_type_name(o.type), "; remove it or set optimizer.type to ",
           demo ? "AdamW" : "DeMo");
  opt.check_keys(own);
  // Kept as doubles, but AdamW rounds them to float: both must be floats too (1e39 is inf,
  // 1e-50 is 0 as a float).
  const auto float_range = [](double v) {
    return std::fabs(v) <= std::numeric_limits<float>::max() &&
           (v == 0 || static_cast<float>(v) != 0);
  };
  opt.read_real("lr", o.lr, "a number > 0", [&](double v) { return v > 0 && float_range(v); });
  opt.read_real("weight_decay", o.weight_decay, "a number >= 0",
                [&](double v) { return v >= 0 && float_range(v); });
  if (!demo) {
    if (const json* betas = opt.find("betas")) {
      const std::string where = opt.path("betas");
      if (!betas->is_array() || betas->size() != 2)
        fail(where, " must be an array of two numbers [beta1, beta2], each in [0, 1), got ",
             describe(*betas));
      const auto in_unit = [](double v) { return v >= 0 && v < 1; };
      o.beta1 =
          Section::real_value<float>((*betas)[0], where + "[0]", "a number in [0, 1)", in_unit);
      o.beta2 =
          Section::real_value<float>((*betas)[1], where + "[1]", "a number in [0, 1)", in_unit);
    }
    opt.read_real("eps", o.eps, "a number > 0", [](double v) { return v > 0; });
  } else {
    opt.read_real("compression_decay", o.compression_decay, "a number in [0, 1)",
                  [](double v) { return v >= 0 && v < 1; });
    // Whether it fits each tensor's blocks is checked when the blocks are known (optim/demo.h).
    opt.read_int("compression_topk", o.compression_topk, 1);
    opt.read_int("compression_chunk", o.compression_chunk, 1);
    if (const json* values = opt.find("compression_values")) {
      if (!values->is_string())
        fail(opt.path("compression_values"), " must be \"fp32\", \"bf16\" or \"sign\", got ",
             describe(*values));
      o.compression_values = parse_demo_value_format(values->get<std::string>());
    }
  }
  const Section demo_section = top.section("demo");
  TANDEM_CHECK(demo || demo_section.find("replica_check_interval") == nullptr,
               "demo.replica_check_interval applies to optimizer.type DeMo only; remove it or set "
               "optimizer.type to DeMo");
  demo_section.check_keys(kDemoKeys);
  demo_section.read_int("replica_check_interval", config.demo.replica_check_interval, 0);

  const Section scheduler = top.section("scheduler");
  scheduler.check_keys(kTypedKeys, "params", kSchedulerParamKeys);
  scheduler.read_type(kSchedulerType);
  const Section sched = scheduler.section("params");
  sched.check_keys(kSchedulerParamKeys);
  sched.read_int("warmup_num_steps", config.scheduler.warmup_num_steps, 0);
  sched.read_real("cos_min_ratio", config.scheduler.cos_min_ratio, "a number in [0, 1]",
                  [](double v) { return v >= 0 && v <= 1; });

  const Section zero = top.section("zero_optimization");
  zero.check_keys(kZeroKeys);
  int64_t sub_group_size = static_cast<int64_t>(config.offload.sub_group_size);
  zero.read_int("sub_group_size", sub_group_size, 1);
  config.offload.sub_group_size = static_cast<size_t>(sub_group_size);
  ZeroConfig& z = config.zero;
  zero.read_int("stage", z.stage, 0, 3, "0, 1, 2 or 3");
  zero.read_bool("overlap_comm", z.overlap_comm);
  zero.read_bool("contiguous_gradients", z.contiguous_gradients);
  auto read_size = [&](std::string_view key, size_t& out, int64_t least = 1) {
    int64_t v = static_cast<int64_t>(out);
    zero.read_int(key, v, least);
    out = static_cast<size_t>(v);
  };
  read_size("reduce_bucket_size", z.reduce_bucket_size);
  read_size("allgather_bucket_size", z.allgather_bucket_size);
  // 0: no prefetch; no block kept whole.
  read_size("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0);
  read_size("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0);
  read_size("stage3_max_live_parameters", z.stage3_max_live_parameters);

  const Section offload = top.section("offload_optimizer");
  offload.check_keys(kOffloadKeys);
  if (const json* schedule = offload.find("schedule")) {
    const std::string name = schedule->is_string() ? lower(schedule->get<std::string>()) : "";
    bool known = false;
    for (UpdateSchedule s : {UpdateSchedule::kDevice, UpdateSchedule::kCpu, UpdateSchedule::kRatio,
                             UpdateSchedule::kInterleave, UpdateSchedule::kAuto}) {
      if (update_schedule_name(s) == name) {
        config.offload.schedule = s;
        known = true;
      }
    }
    TANDEM_CHECK(known, "offload_optimizer.schedule must be one of ", join(kSchedules), ", got ",
                 schedule->dump());
  }
  offload.read_real("ratio", config.offload.ratio, "a number in [0, 1]",
                    [](double v) { return v >= 0 && v <= 1; });
  offload.read_int("stride", config.offload.stride, 1);
  offload.read_int("staging_buffers", config.offload.staging_buffers, 1);

  const Section device = top.section("device");
  device.check_keys(kDeviceKeys);
  // Every enumerated value is read without regard to case, as the schedule and the types.
  std::string device_type(device_kind_name(config.device.type));
  device.read_string("type", device_type);
  device_type = lower(device_type);
  TANDEM_CHECK(device_type == "cpu" || device_type == "cuda", "device.type must be one of ",
               join(kDeviceTypes), ", got \"", device_type, "\"");
  config.device.type = device_type == "cuda" ? DeviceKind::kCuda : DeviceKind::kHostOnly;
  // Bounded so that the bytes fit a size_t with room (and no device has a petabyte).
  device.read_real("memory_gb", config.device.memory_gb, "a number > 0 and at most 1048576",
                   [](double v) { return v > 0 && v <= 1048576; });

  const Section bf16 = top.section("bf16");
  bf16.check_keys(kBf16Keys);
  bf16.read_bool("enabled", config.bf16);

  const Section train = top.section("train");
  train.check_keys(kTrainKeys);
  TrainLoopConfig& t = config.train;
  train.read_int("steps", t.steps, 1);
  train.read_uint64("seed", t.seed);
  train.read_int("seq_len", t.seq_len, 0, m.context_length,
                 cat("an integer in [0, ", m.context_length, "] (at most model.context_length = ",
                     m.context_length, "; 0 means model.context_length)"));
  train.read_int("eval_interval", t.eval_interval, 0);
  train.read_int("eval_batches", t.eval_batches, 1);
  train.read_int("checkpoint_interval", t.checkpoint_interval, 0);
  train.read_int("log_interval", t.log_interval, 0);
  train.read_string("init_from", t.init_from);
  TANDEM_CHECK(!train.read_string("output_dir", t.output_dir).empty(),
               "train.output_dir must not be empty");
  train.read_int("sample_bytes", t.sample_bytes, 0);
  train.read_int("max_shard_size", t.max_shard_size, 1);
  train.read_bool("lazy_checkpoints", t.lazy_checkpoints);
  train.read_int("keep_checkpoints", t.keep_checkpoints, 0);
  train.read_int("max_skipped_steps", t.max_skipped_steps, 0);
  train.read_real("checkpoint_memory_mb", t.checkpoint_memory_mb, "a number >= 0 (0: automatic)",
                  [](double v) { return v >= 0; });
  std::string failure = "stop";
  train.read_string("checkpoint_failure", failure);
  failure = lower(failure);
  TANDEM_CHECK(failure == "stop" || failure == "continue", "train.checkpoint_failure = \"", failure,
               "\": must be \"stop\" (the default) or \"continue\"");
  t.checkpoint_failure =
      failure == "stop" ? CheckpointFailure::kStop : CheckpointFailure::kContinue;

  if (demo) {
    TANDEM_CHECK(z.stage == 0, "optimizer.type DeMo needs zero_optimization.stage 0, got ", z.stage,
                 ": DeMo never reduces gradients and every rank keeps its own whole momentum; set "
                 "zero_optimization.stage to 0");
    TANDEM_CHECK(config.offload.schedule != UpdateSchedule::kAuto,
                 "offload_optimizer.schedule auto is not available with optimizer.type DeMo (the "
                 "performance model is calibrated for AdamW's kernels); choose device, cpu, ratio "
                 "or interleave");
  }
  return config;
}

void apply_config_override(json& config_json, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  TANDEM_CHECK(eq != std::string::npos, "no '=' in override '", assignment,
               "'; expected key=value, e.g. train.steps=100");
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  TANDEM_CHECK(!key.empty(), "empty key in override '", assignment,
               "'; expected key=value, e.g. train.steps=100");

  std::vector<std::string> parts;
  for (size_t begin = 0;;) {
    const size_t dot = key.find('.', begin);
    parts.push_back(key.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    TANDEM_CHECK(!parts.back().empty(), "empty component in key '", key, "' of override '",
                 assignment, "'; expected a dotted path, e.g. optimizer.params.lr=3e-4");
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }

  if (config_json.is_null()) config_json = json::object();
  json* node = &config_json;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = join_path(walked, parts[i]);
    json& child = (*node)[parts[i]];  // creates null when absent
    if (child.is_null()) child = json::object();
    if (!child.is_object())
      fail("cannot apply override '", assignment, "': '", walked, "' is ", describe(child),
           ", not an object");
    node = &child;
  }
  if (!node->is_object())
    fail("cannot apply override '", assignment, "': the configuration is not an object");

  // Valid JSON is taken as such (3e-4, true, [0.9,0.99], "quoted"); anything else is a bare
  // string, so paths need no quotes on a command line (train.output_dir=runs/y).
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;
  (*node)[parts.back()] = std::move(value);
}

namespace {

// nlohmann keeps the last of two equal keys silently; a config that sets "lr" twice is a
// mistake whichever one was meant, so it is refused with the path of the repeated key.
json parse_json_refusing_duplicates(const std::string& text) {
  struct Level {
    std::set<std::string> keys;
    std::string path;
    std::string last_key;
  };
  std::vector<Level> stack;
  const auto callback = [&stack](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: {
        std::string path;
        if (!stack.empty()) path = join_path(stack.back().path, stack.back().last_key);
        stack.push_back({{}, std::move(path), {}});
        break;
      }
      case json::parse_event_t::key: {
        const std::string key = parsed.get<std::string>();
        if (!stack.empty()) {
          if (!stack.back().keys.insert(key).second)
            fail("duplicate key '", join_path(stack.back().path, key), "'");
          stack.back().last_key = key;
        }
        break;
      }
      case json::parse_event_t::object_end:
        if (!stack.empty()) stack.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text, callback);
}

// "line:column" of a byte offset, both 1-based, for editors that jump to file:line:col.
std::string line_column(const std::string& text, size_t byte) {
  byte = std::min(byte, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i < byte; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return cat(line, ':', column);
}

}  // namespace

TrainConfig load_train_config(const std::filesystem::path& path,
                              const std::vector<std::string>& overrides) {
  const std::string text = read_file_text(path);
  json config_json;
  try {
    config_json = parse_json_refusing_duplicates(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and points at the character that broke the parse. nlohmann's own
    // message repeats a position in its own wording; keep only the explanation after it.
    std::string why = e.what();
    if (const size_t colon = why.find(": ");
        why.rfind("[json.exception", 0) == 0 && colon != std::string::npos)
      why = why.substr(colon + 2);
    fail(path.string(), ":", line_column(text, e.byte > 0 ? e.byte - 1 : 0),
         ": JSON syntax error: ", why);
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
  for (const std::string& assignment : overrides) apply_config_override(config_json, assignment);
  try {
    return parse_train_config(config_json);
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
}

namespace {

// The model section in the names parse_train_config reads for its type.
json model_json(const ModelConfig& m) {
  if (m.type == ModelType::kGpt2)
    return {
        {"type", "gpt2"},       {"vocab_size", m.vocab_size}, {"context_length", m.context_length},
        {"n_layer", m.n_layer}, {"n_head", m.n_head},         {"n_embd", m.n_embd}};
  return {{"type", "llama"},
          {"vocab_size", m.vocab_size},
          {"max_position_embeddings", m.context_length},
          {"hidden_size", m.n_embd},
          {"num_hidden_layers", m.n_layer},
          {"num_attention_heads", m.n_head},
          {"num_key_value_heads", m.kv_heads()},
          {"intermediate_size", m.mlp_width()},
          {"rms_norm_eps", m.rms_norm_eps},
          {"rope_theta", m.rope_theta},
          {"tie_word_embeddings", m.tie_word_embeddings}};
}

}  // namespace

json to_json(const TrainConfig& config) {
  const ModelConfig& m = config.model;
  const OptimizerConfig& o = config.optimizer;
  const TrainLoopConfig& t = config.train;
  json out{
      {"model", model_json(m)},
      {"data",
       {{"train_path", config.data.train_path},
        {"val_path", config.data.val_path},
        {"val_fraction", config.data.val_fraction}}},
      {"train_micro_batch_size_per_gpu", config.micro_batch_size},
      {"gradient_accumulation_steps", config.gradient_accumulation_steps},
      {"gradient_clipping", float_json(config.gradient_clipping)},
      {"optimizer", optimizer_json(o)},
      {"scheduler",
       {{"type", std::string(kSchedulerType)},
        {"params",
         {{"warmup_num_steps", config.scheduler.warmup_num_steps},
          {"cos_min_ratio", config.scheduler.cos_min_ratio}}}}},
      {"zero_optimization",
       {{"stage", config.zero.stage},
        {"sub_group_size", config.offload.sub_group_size},
        {"overlap_comm", config.zero.overlap_comm},
        {"contiguous_gradients", config.zero.contiguous_gradients},
        {"reduce_bucket_size", config.zero.reduce_bucket_size},
        {"allgather_bucket_size", config.zero.allgather_bucket_size},
        {"stage3_prefetch_bucket_size", config.zero.stage3_prefetch_bucket_size},
        {"stage3_param_persistence_threshold", config.zero.stage3_param_persistence_threshold},
        {"stage3_max_live_parameters", config.zero.stage3_max_live_parameters}}},
      {"offload_optimizer",
       {{"schedule", std::string(update_schedule_name(config.offload.schedule))},
        {"ratio", config.offload.ratio},
        {"stride", config.offload.stride},
        {"staging_buffers", config.offload.staging_buffers}}},
      {"device",
       {{"type", std::string(device_kind_name(config.device.type))},
        {"memory_gb", config.device.memory_gb}}},
      {"bf16", {{"enabled", config.bf16}}},
      {"train",
       {{"steps", t.steps},
        {"seed", t.seed},
        {"seq_len", t.seq_len},
        {"eval_interval", t.eval_interval},
        {"eval_batches", t.eval_batches},
        {"checkpoint_interval", t.checkpoint_interval},
        {"log_interval", t.log_interval},
        {"output_dir", t.output_dir},
        {"sample_bytes", t.sample_bytes},
        {"init_from", t.init_from},
        {"max_shard_size", t.max_shard_size},
        {"lazy_checkpoints", t.lazy_checkpoints},
        {"keep_checkpoints", t.keep_checkpoints},
        {"checkpoint_memory_mb", t.checkpoint_memory_mb},
        {"max_skipped_steps", t.max_skipped_steps},
        {"checkpoint_failure",
         t.checkpoint_failure == CheckpointFailure::kStop ? "stop" : "continue"}}},
  };
  if (o.type == OptimizerType::kDeMo)
    out["demo"] = {{"replica_check_interval", config.demo.replica_check_interval}};
  return out;
}

}  // namespace tandem
