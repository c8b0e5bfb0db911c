// The optimizers a run may ask for (optimizer.type), one row each: what the config reads
// for it, what its update rule keeps and how the rest of tandem must treat it (checkpoints,
// data parallelism, the offload plan, the performance model, its own step hooks). Code
// outside the rows asks them, never which optimizer it has. An optimizer is one room,
// optim/<name>/, with its rule, its settings and its row (`<name>_family()`); adding one is
// that room, and its type, row and place in the list here (docs/architecture.md, "Where do
// I add"). This header includes no room.
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "tandem/core/enum_names.h"
#include "tandem/core/error.h"
#include "tandem/core/json_keys.h"
#include "tandem/core/step_hooks.h"
#include "tandem/device/device_kind.h"

namespace tandem {

class Communicator;
class Device;
class ParamLayout;
class ThreadPool;
class UpdateRule;
struct OffloadPlan;
struct UpdateDTypes;
struct UpdateRates;

enum class OptimizerType {
  kAdamW,  // optim/adamw/
  kDeMo,   // optim/demo/
  kSgd,    // optim/sgd/ (the recipe's proof: docs/architecture.md, "Where do I add")
};

// JSON: "optimizer": {"type": "AdamW", "DeMo" or "SGD", "params": {...}}, and any section
// of the type's own ("demo"); each type reads its own params (its row's `params`; another
// type's keys are refused, naming the type).
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  // lr and weight_decay, which every type reads, are kept as written (doubles): DeMo
  // derives its decay factor from them in double, as the reference does; AdamW rounds them
  // to float (optim/adamw/adamw_rule.h).
  double lr = 1e-3;
  // The type's own default replaces it (AdamW 0.1, DeMo 0).
  double weight_decay = 0.1;
  // The type's own settings, a struct of its room (AdamWSettings, DemoSettings, ...), read
  // and written by its row's keys only (own_settings); empty: that struct's defaults.
  std::any own;
};

// The settings of `config`'s type, its room's struct `Settings` (its defaults while none
// were read); a config of another type's settings is a bug, and throws.
template <typename Settings>
Settings& own_settings(OptimizerConfig& config) {
  if (!config.own.has_value()) config.own = Settings{};
  Settings* settings = std::any_cast<Settings>(&config.own);
  TANDEM_CHECK(settings != nullptr, "optimizer settings of type ", config.own.type().name(),
               " read as ", typeid(Settings).name());
  return *settings;
}
template <typename Settings>
const Settings& own_settings(const OptimizerConfig& config) {
  static const Settings defaults{};
  if (!config.own.has_value()) return defaults;
  const Settings* settings = std::any_cast<Settings>(&config.own);
  TANDEM_CHECK(settings != nullptr, "optimizer settings of type ", config.own.type().name(),
               " read as ", typeid(Settings).name());
  return *settings;
}

// A field of a type's own settings, for its row's keys: TANDEM_OWN_FIELD(SgdSettings, momentum).
#define TANDEM_OWN_FIELD(Settings, field) \
  [](auto& c) -> auto& { return ::tandem::own_settings<Settings>(c).field; }

// A section of the config's top level that one type alone reads (DeMo's "demo"): refused,
// naming the type, with any other type, and not written then (config/train_config.cc).
struct OptimizerSection {
  std::string_view name;
  std::vector<JsonKey<OptimizerConfig>> keys;
};

// An optimizer's own step hooks (core/step_hooks.h), made by its row for a run: checks of
// its own beside the loop (DeMo's replica check), which no other optimizer inherits.
class OptimizerHooks : public StepHooks {
 public:
  // Whether, after the update of `step` (the step just run), the ranks proved their
  // replicas' parameters identical: the step's "replicas_identical" in the metrics.
  virtual bool replicas_proved_identical(int64_t step) const {
    (void)step;
    return false;
  }
};

// What an optimizer's hooks may use in a run (train/step_runner.cc makes them).
struct OptimizerHookParts {
  const OptimizerConfig& config;
  Communicator& comm;  // the ranks
  // Whether the attempt at the step just run updated the parameters (false: it was skipped,
  // its loss or gradient norm not finite); after_update is called either way.
  std::function<bool()> updated;
  // This rank's fp32 parameters, from wherever the engine keeps them (after the update in
  // flight); no collective.
  std::function<std::vector<float>()> read_params;
};

struct OptimizerFamily {
  OptimizerType type;
  std::string_view name;  // optimizer.type in a config, any case
  // The config of this type before its params are read: the type's own defaults.
  OptimizerConfig defaults;
  // optimizer.params: the keys this type reads, in the order messages list them.
  std::vector<JsonKey<OptimizerConfig>> params;
  // The update rule's state arrays in its order, "param" (the fp32 master weights) first:
  // a checkpoint's names, and 4 bytes per parameter each.
  std::span<const std::string_view> state_arrays;
  // The same, as the memory plan's text names them ("fp32 params, m, v").
  std::string_view state_label;
  // Every rank keeps state of its own for every parameter (DeMo's momentum): a checkpoint
  // holds one copy per rank, rather than one copy partitioned over the ranks.
  bool state_per_rank = false;
  // Data parallelism reduces the gradients over the ranks before the update, so ZeRO may
  // partition the state (stages 1-3); false: the rule exchanges with the other ranks itself
  // (DeMo), every rank keeps its own gradients, and only stage 0 is allowed.
  bool reduces_gradients = true;
  // Offload subgroups end only at tensor ends, so that each tensor is updated whole at one
  // site (DeMo's transforms see a tensor at once); false: any flat index will do.
  bool cuts_at_tensor_ends = false;
  // `comm`: the ranks a rule with a collective phase exchanges with; host updates on `pool`.
  std::unique_ptr<UpdateRule> (*make_rule)(const OptimizerConfig& config, const ParamLayout& layout,
                                           Communicator& comm, ThreadPool& pool);
  // Device bytes the rule's own kernels need beside the state for `plan` (DeMo on a GPU:
  // DCT matrices, scratch, messages); null: none.
  size_t (*device_workspace_bytes)(const OptimizerConfig& config, const ParamLayout& layout,
                                   const OffloadPlan& plan, int world_size,
                                   DeviceKind kind) = nullptr;
  // What one rank sends per step over `world_size` ranks in the rule's own exchange,
  // counted as Communicator::traffic() counts it (DeMo: the all-gather of its packed
  // messages), for the step planner; null for a type whose gradients data parallelism
  // reduces (zero/zero_traffic.h counts those).
  double (*exchange_bytes)(const OptimizerConfig& config, const ParamLayout& layout,
                           int world_size) = nullptr;
  // A line on how its settings apply to the model's tensors, for `tandem plan` and the
  // start of a run (DeMo: compression_topk clamped to the blocks smaller than it); null,
  // or returning "": nothing to say.
  std::string (*settings_note)(const OptimizerConfig& config, const ParamLayout& layout) = nullptr;
  // Times the rule's kernels for the performance model (offload/perf_model.h); null: the
  // model knows nothing of them, so offload_optimizer.schedule auto is refused and the plan
  // is not costed. `before_each_kind`: as calibrate_update_rates takes it.
  UpdateRates (*calibrate_rates)(Device& device, ThreadPool& pool, size_t sample_params,
                                 const UpdateDTypes& types, size_t pass_params,
                                 const std::function<void()>& before_each_kind) = nullptr;
  // The bytes per parameter its device kernel moves through a GPU's memory in an update
  // (AdamW 28): a GPU that is not here updates at its memory bandwidth over these
  // (config/memory_plan.h, AssumedGpu); 0: not known, and no such GPU is costed.
  size_t gpu_bytes_per_param = 0;
  // Sections of the config's top level that it alone reads (DeMo's "demo").
  std::vector<OptimizerSection> sections = {};
  // Its own step hooks for a run (the trainer registers them after the gradients' hooks);
  // null, or returning null: none.
  std::unique_ptr<OptimizerHooks> (*make_hooks)(const OptimizerHookParts& parts) = nullptr;

  // The state arrays beside the fp32 params (AdamW: exp_avg, exp_avg_sq; DeMo: delta).
  std::vector<std::string> state_names() const;
  // fp32 state bytes per parameter, the master weights included (AdamW 12, DeMo 8).
  size_t state_bytes_per_param() const { return state_arrays.size() * sizeof(float); }
  // The flat indices where offload subgroups may end; empty when any index will do.
  std::vector<size_t> subgroup_cut_points(const ParamLayout& layout) const;
  std::string note_on(const OptimizerConfig& config, const ParamLayout& layout) const {
    return settings_note ? settings_note(config, layout) : std::string();
  }
  size_t workspace_bytes(const OptimizerConfig& config, const ParamLayout& layout,
                         const OffloadPlan& plan, int world_size, DeviceKind kind) const {
    return device_workspace_bytes ? device_workspace_bytes(config, layout, plan, world_size, kind)
                                  : 0;
  }
};

// Each family's row, defined in its room (optim/<name>/).
OptimizerFamily adamw_family();
OptimizerFamily demo_family();
OptimizerFamily sgd_family();

// Every family, in the order messages list them.
inline std::span<const OptimizerFamily> optimizer_families() {
  static const std::vector<OptimizerFamily> families = {adamw_family(), demo_family(),
                                                        sgd_family()};
  return families;
}

// The parameters every family reads alike (a number > 0, a number >= 0, each also a finite
// float).
JsonKey<OptimizerConfig> lr_param();
JsonKey<OptimizerConfig> weight_decay_param();

const OptimizerFamily& optimizer_family(OptimizerType type);
// The family named `name` (any case); null when none is.
const OptimizerFamily* find_optimizer_family(std::string_view name);
inline std::string_view optimizer_type_name(OptimizerType type) {
  return optimizer_family(type).name;
}

}  // namespace tandem
