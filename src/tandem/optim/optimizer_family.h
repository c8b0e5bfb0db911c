// The optimizers a run may ask for (optimizer.type), one row each: what the config reads
// for it, what its update rule keeps and how the rest of tandem must treat it (checkpoints,
// data parallelism, the offload plan, the performance model). Code outside the rows asks
// them, never which optimizer it has, so adding one is a rule with its row in
// optim/<name>_rule.cc, and its type, fields and place in the list here
// (docs/architecture.md, "Where do I add").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/enum_names.h"
#include "tandem/core/json_keys.h"
#include "tandem/device/device_kind.h"
#include "tandem/optim/demo_wire.h"

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
  kAdamW,  // optim/adamw_rule.h
  kDeMo,   // optim/demo_rule.h
};

// JSON: "optimizer": {"type": "AdamW" or "DeMo", "params": {...}}; each type reads its own
// params (its row's `params`; another type's keys are refused, naming the type).
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  // lr and weight_decay are kept as written (doubles): DeMo derives its decay factor from
  // them in double, as the reference does; AdamW rounds them to float (optim/adamw_rule.h).
  double lr = 1e-3;
  // AdamW
  float beta1 = 0.9f;  // "betas": [beta1, beta2]
  float beta2 = 0.95f;
  float eps = 1e-8f;
  // Decoupled. AdamW: applied to 2-D weights only, default 0.1. DeMo: to every tensor, as
  // the reference does, default 0.
  double weight_decay = 0.1;
  // DeMo (optim/demo.h)
  float compression_decay = 0.999f;
  int64_t compression_topk = 32;
  int64_t compression_chunk = 64;
  DemoValueFormat compression_values = DemoValueFormat::kFp32;  // "fp32", "bf16", "sign"
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
  // Times the rule's kernels for the performance model (offload/perf_model.h); null: the
  // model knows nothing of them, so offload_optimizer.schedule auto is refused and the plan
  // is not costed.
  UpdateRates (*calibrate_rates)(Device& device, ThreadPool& pool, size_t sample_params,
                                 const UpdateDTypes& types, size_t pass_params) = nullptr;

  // The state arrays beside the fp32 params (AdamW: exp_avg, exp_avg_sq; DeMo: delta).
  std::vector<std::string> state_names() const;
  // fp32 state bytes per parameter, the master weights included (AdamW 12, DeMo 8).
  size_t state_bytes_per_param() const { return state_arrays.size() * sizeof(float); }
  // The flat indices where offload subgroups may end; empty when any index will do.
  std::vector<size_t> subgroup_cut_points(const ParamLayout& layout) const;
  size_t workspace_bytes(const OptimizerConfig& config, const ParamLayout& layout,
                         const OffloadPlan& plan, int world_size, DeviceKind kind) const {
    return device_workspace_bytes ? device_workspace_bytes(config, layout, plan, world_size, kind)
                                  : 0;
  }
};

// Each family's row, defined beside its rule (optim/<name>_rule.cc).
OptimizerFamily adamw_family();
OptimizerFamily demo_family();
// The parameters every family reads alike (a number > 0, a number >= 0, each also a finite
// float).
JsonKey<OptimizerConfig> lr_param();
JsonKey<OptimizerConfig> weight_decay_param();

// Every family, in the order messages list them.
std::span<const OptimizerFamily> optimizer_families();
const OptimizerFamily& optimizer_family(OptimizerType type);
// The family named `name` (any case); null when none is.
const OptimizerFamily* find_optimizer_family(std::string_view name);
inline std::string_view optimizer_type_name(OptimizerType type) {
  return optimizer_family(type).name;
}

}  // namespace tandem
