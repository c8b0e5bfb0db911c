// The run configuration's schema: every key declared once, in one table, from which
// parse_train_config's checks and messages and to_json's output both come. A config file
// is the one input every user writes by hand, so every mistake in it is reported here,
// once, before any data is loaded (the reader's messages: core/json_reader.h).
//
// Sections read in the table's order, so a key may be checked against one read before it
// (train.seq_len against the model's context length). Optimizer parameters are their
// family's (optim/optimizer_family.h).

#include "tandem/config/train_config.h"

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/json_keys.h"
#include "tandem/model/model_family.h"

namespace tandem {

using json = nlohmann::json;

namespace {

using Keys = JsonKeys<TrainConfig>;
using Key = Keys::Key;

constexpr std::string_view kTypedKeys[] = {"type", "params"};
constexpr std::string_view kSchedulerType = "WarmupCosineLR";

// "model": {"type": ..., <that family's keys>} (model/model_family.h). Without it, a run that
// starts from a Hugging Face model directory (train.init_from) trains that directory's model.
Key model_key() {
  return {"model",
          [](const JsonSection& top, TrainConfig& config) {
            std::string init_from;
            if (top.find("model") == nullptr &&
                !top.section("train").read_string("init_from", init_from).empty()) {
              config.model = read_hf_model_config(init_from, "train.init_from");
              return;
            }
            const JsonSection model = top.section("model");
            std::string type = "gpt2";
            const ModelType family = parse_model_type(ascii_lower(model.read_string("type", type)));
            config.model = model_family(family).read_run_config(model);
          },
          [](const TrainConfig& config) {
            return model_family(config.model.type).write_run_config(config.model);
          }};
}

std::vector<Key> data_keys() {
  Key train_path = Keys::text("train_path", TANDEM_FIELD(data.train_path), false);
  const auto read_text = train_path.read;
  train_path.read = [read_text](const JsonSection& data, TrainConfig& config) {
    TANDEM_CHECK(data.find("train_path") != nullptr, data.path("train_path"),
                 " is required (a text file or an llm.c token shard *.bin), e.g. \"data\": "
                 "{\"train_path\": \"data/tinyshakespeare.txt\"}");
    read_text(data, config);
  };
  Key val_fraction =
      Keys::real("val_fraction", TANDEM_FIELD(data.val_fraction), "", [](double) { return true; });
  val_fraction.read = [](const JsonSection& data, TrainConfig& config) {
    if (config.data.val_path.empty())
      data.read_real("val_fraction", config.data.val_fraction,
                     "a number in (0, 1) when data.val_path is empty",
                     [](double v) { return v > 0 && v < 1; });
    else  // unused with a separate validation file, but still held to a sane range
      data.read_real("val_fraction", config.data.val_fraction, "a number in [0, 1)",
                     [](double v) { return v >= 0 && v < 1; });
  };
  return {train_path, Keys::text("val_path", TANDEM_FIELD(data.val_path)), val_fraction};
}

std::vector<std::string_view> every_optimizer_param() {
  std::vector<std::string_view> names;
  for (const OptimizerFamily& family : optimizer_families())
    for (const JsonKey<OptimizerConfig>& key : family.params)
      if (std::find(names.begin(), names.end(), key.name) == names.end()) names.push_back(key.name);
  return names;
}

// A parameter of another optimizer than the one chosen: named with the type it belongs to.
void refuse_other_families_params(const JsonSection& params, const OptimizerFamily& chosen) {
  const auto own = json_key_names<OptimizerConfig>(chosen.params);
  for (const OptimizerFamily& other : optimizer_families())
    for (const JsonKey<OptimizerConfig>& key : other.params)
      if (std::find(own.begin(), own.end(), key.name) == own.end() &&
          params.find(key.name) != nullptr)
        fail(params.path(key.name), " is a parameter of optimizer.type ", other.name, ", not of ",
             chosen.name, "; remove it or set optimizer.type to ", other.name);
}

// "optimizer": {"type": <a family's name>, "params": {<that family's keys>}}.
Key optimizer_key() {
  return {"optimizer",
          [](const JsonSection& top, TrainConfig& config) {
            const JsonSection optimizer = top.section("optimizer");
            optimizer.check_keys(kTypedKeys, "params", every_optimizer_param());
            if (const json* type = optimizer.find("type")) {
              const OptimizerFamily* family =
                  type->is_string() ? find_optimizer_family(type->get<std::string>()) : nullptr;
              if (family == nullptr) {
                std::string names;
                for (const OptimizerFamily& f : optimizer_families())
                  names += cat(names.empty() ? "" : ", ", '"', f.name, '"');
                fail("optimizer.type must be one of: ", names, "; got ", describe_json(*type));
              }
              config.optimizer = family->defaults;
            }
            const OptimizerFamily& family = optimizer_family(config.optimizer.type);
            const JsonSection params = optimizer.section("params");
            refuse_other_families_params(params, family);
            read_json_keys<OptimizerConfig>(params, family.params, config.optimizer);
          },
          [](const TrainConfig& config) {
            const OptimizerFamily& family = optimizer_family(config.optimizer.type);
            return json{
                {"type", std::string(family.name)},
                {"params", write_json_keys<OptimizerConfig>(family.params, config.optimizer)}};
          }};
}

// A section that only the optimizer `family` reads (its row's `sections`: "demo" for DeMo),
// read into config.optimizer: refused, naming the type, with any other, and not written.
Key section_of_optimizer(const OptimizerFamily& family, const OptimizerSection& section) {
  const OptimizerType type = family.type;
  const std::string_view owner = family.name, name = section.name;
  const std::vector<JsonKey<OptimizerConfig>> keys = section.keys;
  return {name,
          [=](const JsonSection& top, TrainConfig& config) {
            const JsonSection own = top.section(name);
            for (const JsonKey<OptimizerConfig>& key : keys)
              TANDEM_CHECK(config.optimizer.type == type || own.find(key.name) == nullptr,
                           own.path(key.name), " applies to optimizer.type ", owner,
                           " only; remove it or set optimizer.type to ", owner);
            if (config.optimizer.type == type)
              read_json_keys<OptimizerConfig>(own, keys, config.optimizer);
            else
              own.check_keys(json_key_names<OptimizerConfig>(keys));
          },
          [=](const TrainConfig& config) {
            return config.optimizer.type == type
                       ? write_json_keys<OptimizerConfig>(keys, config.optimizer)
                       : json();
          }};
}

// "optimizer", then every family's own sections.
std::vector<Key> optimizer_keys() {
  std::vector<Key> keys = {optimizer_key()};
  for (const OptimizerFamily& family : optimizer_families())
    for (const OptimizerSection& section : family.sections)
      keys.push_back(section_of_optimizer(family, section));
  return keys;
}

// "scheduler": {"type": "WarmupCosineLR", "params": {...}}, the one schedule there is.
Key scheduler_key() {
  static const std::vector<Key> params = {
      Keys::integer("warmup_num_steps", TANDEM_FIELD(scheduler.warmup_num_steps), 0),
      Keys::real("cos_min_ratio", TANDEM_FIELD(scheduler.cos_min_ratio), "a number in [0, 1]",
                 [](double v) { return v >= 0 && v <= 1; })};
  return {"scheduler",
          [](const JsonSection& top, TrainConfig& config) {
            const JsonSection scheduler = top.section("scheduler");
            scheduler.check_keys(kTypedKeys, "params", json_key_names<TrainConfig>(params));
            scheduler.read_type(kSchedulerType);
            read_json_keys<TrainConfig>(scheduler.section("params"), params, config);
          },
          [](const TrainConfig& config) {
            return json{{"type", std::string(kSchedulerType)},
                        {"params", write_json_keys<TrainConfig>(params, config)}};
          }};
}

std::vector<Key> zero_keys() {
  return {Keys::integer("stage", TANDEM_FIELD(zero.stage), 0, 3, "0, 1, 2 or 3"),
          Keys::integer("sub_group_size", TANDEM_FIELD(offload.sub_group_size), 1),
          Keys::boolean("overlap_comm", TANDEM_FIELD(zero.overlap_comm)),
          Keys::boolean("contiguous_gradients", TANDEM_FIELD(zero.contiguous_gradients)),
          Keys::integer("reduce_bucket_size", TANDEM_FIELD(zero.reduce_bucket_size), 1),
          Keys::integer("allgather_bucket_size", TANDEM_FIELD(zero.allgather_bucket_size), 1),
          // 0: no prefetch; no block kept whole.
          Keys::integer("stage3_prefetch_bucket_size",
                        TANDEM_FIELD(zero.stage3_prefetch_bucket_size), 0),
          Keys::integer("stage3_param_persistence_threshold",
                        TANDEM_FIELD(zero.stage3_param_persistence_threshold), 0),
          Keys::integer("stage3_max_live_parameters", TANDEM_FIELD(zero.stage3_max_live_parameters),
                        1)};
}

std::vector<Key> train_loop_keys() {
  Key seq_len = Keys::integer("seq_len", TANDEM_FIELD(train.seq_len), 0);
  seq_len.read = [](const JsonSection& train, TrainConfig& config) {
    const int most = config.model.context_length;
    train.read_int("seq_len", config.train.seq_len, 0, most,
                   cat("an integer in [0, ", most, "] (at most model.context_length = ", most,
                       "; 0 means model.context_length)"));
  };
  return {Keys::integer("steps", TANDEM_FIELD(train.steps), 1),
          Keys::uint64("seed", TANDEM_FIELD(train.seed)),
          seq_len,
          Keys::integer("eval_interval", TANDEM_FIELD(train.eval_interval), 0),
          Keys::integer("eval_batches", TANDEM_FIELD(train.eval_batches), 1),
          Keys::integer("checkpoint_interval", TANDEM_FIELD(train.checkpoint_interval), 0),
          Keys::integer("log_interval", TANDEM_FIELD(train.log_interval), 0),
          Keys::text("output_dir", TANDEM_FIELD(train.output_dir), false),
          Keys::integer("sample_bytes", TANDEM_FIELD(train.sample_bytes), 0),
          Keys::text("init_from", TANDEM_FIELD(train.init_from)),
          Keys::integer("max_shard_size", TANDEM_FIELD(train.max_shard_size), 1),
          Keys::boolean("lazy_checkpoints", TANDEM_FIELD(train.lazy_checkpoints)),
          Keys::integer("keep_checkpoints", TANDEM_FIELD(train.keep_checkpoints), 0),
          Keys::real("checkpoint_memory_mb", TANDEM_FIELD(train.checkpoint_memory_mb),
                     "a number >= 0 (0: automatic)", [](double v) { return v >= 0; }),
          Keys::integer("max_skipped_steps", TANDEM_FIELD(train.max_skipped_steps), 0),
          Keys::choice("checkpoint_failure", TANDEM_FIELD(train.checkpoint_failure),
                       kCheckpointFailureNames)};
}

// A key of DeepSpeed's that means nothing here: refused, saying why, and never written.
Key refused(std::string_view name, std::string_view why) {
  return {name,
          [=](const JsonSection& section, TrainConfig&) {
            TANDEM_CHECK(section.find(name) == nullptr, section.path(name), ": ", why,
                         "; remove it");
          },
          [](const TrainConfig&) { return json(); }, true};
}

// An integer key that may be "auto" instead (kAuto: the step planner's choice).
template <typename Field>
Key integer_or_auto(std::string_view name, Field field, int64_t min, std::string description) {
  Key key = Keys::integer(name, field, min, std::numeric_limits<int>::max(),
                          cat(description, ", or \"auto\" (tandem chooses)"));
  const auto read_integer = key.read;
  key.read = [=](const JsonSection& section, TrainConfig& config) {
    const json* value = section.find(name);
    if (value != nullptr && value->is_string() && ascii_lower(value->get<std::string>()) == "auto")
      field(config) = kAuto;
    else
      read_integer(section, config);
  };
  key.write = [=](const TrainConfig& config) {
    return field(config) == kAuto ? json("auto") : json(field(config));
  };
  return key;
}

// DeepSpeed's "activation_checkpointing" keys: interval is tandem's own (DeepSpeed's
// number_checkpoints counts checkpoints of a model it cannot see).
std::vector<Key> activation_checkpointing_keys() {
  return {
      integer_or_auto("interval", TANDEM_FIELD(activation_checkpointing.interval), 0,
                      "a non-negative integer (0: off; k: keep every k-th layer's output)"),
      Keys::boolean("cpu_checkpointing", TANDEM_FIELD(activation_checkpointing.cpu_checkpointing)),
      refused("partition_activations",
              "it splits activations over model-parallel ranks, and tandem has no model "
              "parallelism"),
      refused("number_checkpoints",
              "tandem counts in layers: set activation_checkpointing.interval instead"),
      refused("contiguous_memory_optimization",
              "tandem's kept outputs are one contiguous buffer already"),
      refused("synchronize_checkpoint_boundary",
              "tandem's recompute is ordered on one stream; there is nothing to synchronize"),
      refused("profile", "use --trace for a Chrome trace of the steps")};
}

// The whole file, top-level keys in the order messages list them and sections are read.
const std::vector<Key>& schema() {
  static const std::vector<Key> keys = [] {
    std::vector<Key> top = {
        model_key(),
        Keys::section("data", data_keys()),
        Keys::integer("train_batch_size", TANDEM_FIELD(train_batch_size), 0,
                      std::numeric_limits<int64_t>::max(),
                      "a non-negative integer (sequences per optimizer step over all ranks; 0: "
                      "train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks)"),
        Keys::integer("train_batch_tokens", TANDEM_FIELD(train_batch_tokens), 0,
                      std::numeric_limits<int64_t>::max(),
                      "a non-negative integer (tokens per optimizer step over all ranks: "
                      "train_batch_size x the sequence length; 0: not given)"),
        integer_or_auto("train_micro_batch_size_per_gpu", TANDEM_FIELD(micro_batch_size), 1,
                        "a positive integer"),
        integer_or_auto("gradient_accumulation_steps", TANDEM_FIELD(gradient_accumulation_steps), 1,
                        "a positive integer"),
        Keys::real("gradient_clipping", TANDEM_FIELD(gradient_clipping),
                   "a number >= 0 (0 disables)", [](double v) { return v >= 0; }),
    };
    // "optimizer", and each optimizer's own sections after it.
    for (Key& key : optimizer_keys()) top.push_back(std::move(key));
    top.insert(
        top.end(),
        {
            scheduler_key(),
            Keys::section("zero_optimization", zero_keys()),
            Keys::section(
                "offload_optimizer",
                {Keys::choice("schedule", TANDEM_FIELD(offload.schedule), kUpdateScheduleNames),
                 Keys::real("ratio", TANDEM_FIELD(offload.ratio), "a number in [0, 1]",
                            [](double v) { return v >= 0 && v <= 1; }),
                 Keys::integer("stride", TANDEM_FIELD(offload.stride), 1),
                 Keys::integer("staging_buffers", TANDEM_FIELD(offload.staging_buffers), 1),
                 Keys::boolean("overlap_forward", TANDEM_FIELD(offload.overlap_forward))}),
            Keys::section(
                "device",
                {Keys::choice("type", TANDEM_FIELD(device.type), kDeviceKindNames),
                 // Bounded so that the bytes fit a size_t with room (and no device has a petabyte).
                 Keys::real("memory_gb", TANDEM_FIELD(device.memory_gb),
                            "a number > 0 and at most 1048576",
                            [](double v) { return v > 0 && v <= 1048576; })}),
            Keys::section("bf16", {Keys::boolean("enabled", TANDEM_FIELD(bf16))}),
            Keys::section("activation_checkpointing", activation_checkpointing_keys()),
            Keys::section("train", train_loop_keys()),
        });
    return top;
  }();
  return keys;
}

// What an optimizer family cannot run with, said once the whole file is read.
void check_optimizer_fits(const TrainConfig& config) {
  const OptimizerFamily& family = optimizer_family(config.optimizer.type);
  if (!family.reduces_gradients)
    TANDEM_CHECK(config.zero.stage == 0, "optimizer.type ", family.name,
                 " needs zero_optimization.stage 0, got ", config.zero.stage, ": ", family.name,
                 " never reduces gradients and every rank keeps its own whole state; set "
                 "zero_optimization.stage to 0");
  if (family.calibrate_rates == nullptr)
    TANDEM_CHECK(config.offload.schedule != UpdateSchedule::kAuto,
                 "offload_optimizer.schedule auto is not available with optimizer.type ",
                 family.name,
                 " (the performance model is not calibrated for its kernels); choose device, "
                 "cpu, ratio or interleave");
}

// train_batch_tokens as train_batch_size: whole sequences, and the same batch when both are set.
void resolve_batch_tokens(TrainConfig& config) {
  const int64_t tokens = config.train_batch_tokens;
  if (tokens == 0) return;
  const int64_t T = config.seq_len();
  if (tokens % T != 0) {
    const int64_t below = tokens / T, above = below + 1;
    fail("train_batch_tokens ", tokens, " is not a whole number of sequences of ", T,
         " tokens (train.seq_len, else model.context_length); the nearest are ",
         below > 0 ? cat(below * T, " (", below, " sequences) and ") : std::string(), above * T,
         " (", above, below > 0 ? " sequences)" : " sequence)");
  }
  TANDEM_CHECK(config.train_batch_size == 0 || config.train_batch_size == tokens / T,
               "train_batch_tokens ", tokens, " is ", tokens / T, " sequences of ", T,
               " tokens, but train_batch_size is ", config.train_batch_size,
               "; set only one of them");
  config.train_batch_size = tokens / T;
}

// What "auto" needs: a batch per optimizer step to split, and no half-made choice of recompute.
void check_auto_settings(const TrainConfig& config) {
  for (const auto& [name, value] :
       {std::pair{"train_micro_batch_size_per_gpu", config.micro_batch_size},
        std::pair{"gradient_accumulation_steps", config.gradient_accumulation_steps}})
    TANDEM_CHECK(value != kAuto || config.train_batch_size > 0, name,
                 " is \"auto\", which splits train_batch_size (sequences per optimizer step over "
                 "all ranks) into micro-batches, but train_batch_size is not set; set it, e.g. "
                 "\"train_batch_size\": 64, or train_batch_tokens");
  TANDEM_CHECK(config.activation_checkpointing.interval != kAuto ||
                   !config.activation_checkpointing.cpu_checkpointing,
               "activation_checkpointing.interval is \"auto\", which chooses cpu_checkpointing "
               "too; remove activation_checkpointing.cpu_checkpointing, or set the interval");
}

}  // namespace

TrainConfig parse_train_config(const json& config_json) {
  if (!config_json.is_object())
    fail("the configuration must be a JSON object ({...}), got ", describe_json(config_json));
  TrainConfig config;
  read_json_keys<TrainConfig>(JsonSection(&config_json, ""), schema(), config);
  check_optimizer_fits(config);
  resolve_batch_tokens(config);
  check_auto_settings(config);
  TANDEM_CHECK(!config.activation_checkpointing.cpu_checkpointing ||
                   config.activation_checkpointing.interval != 0,
               "activation_checkpointing.cpu_checkpointing keeps the inputs of recomputed "
               "segments in host memory, but activation_checkpointing.interval is 0 (nothing is "
               "recomputed); set the interval (1: every layer) or remove cpu_checkpointing");
  return config;
}

json to_json(const TrainConfig& config) { return write_json_keys<TrainConfig>(schema(), config); }

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
  if (!config_json.is_object())
    fail("cannot apply override '", assignment,
         "': the configuration's top level must be an "
         "object ({...}), but it is ",
         describe_json(config_json));
  json* node = &config_json;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = join_json_path(walked, parts[i]);
    json& child = (*node)[parts[i]];  // creates null when absent
    if (child.is_null()) child = json::object();
    if (!child.is_object())
      fail("cannot apply override '", assignment, "': '", walked, "' is ", describe_json(child),
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

TrainConfig load_train_config(const std::filesystem::path& path,
                              const std::vector<std::string>& overrides) {
  json config_json = read_json_file(path);
  try {
    for (const std::string& assignment : overrides) apply_config_override(config_json, assignment);
    TrainConfig config = parse_train_config(config_json);
    config.source_file = path;
    config.source_overrides = overrides;
    return config;
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
}

std::string TrainConfig::source_arguments() const {
  // Single quotes around anything the shell would read otherwise.
  auto quoted = [](const std::string& word) {
    if (!word.empty() &&
        word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               "0123456789._-/=:,+@") == std::string::npos)
      return word;
    std::string out = "'";
    for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  };
  std::string text = cat("--config ", source_file.empty() ? "FILE" : quoted(source_file.string()));
  for (const std::string& o : source_overrides) text += cat(" --set ", quoted(o));
  return text;
}

}  // namespace tandem
