// The update rule a run's config asks for (optimizer.type: AdamW, optim/adamw_rule.h, or
// DeMo, optim/demo_rule.h) and what the rest of the trainer must know of it: the names of
// its state arrays in a checkpoint, whether they differ between ranks, its bytes per
// parameter in memory and where the offload plan may cut subgroups. Adding an optimizer
// means a rule and a case in each function here (docs/architecture.md).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/thread_pool.h"
#include "tandem/model/param_layout.h"
#include "tandem/offload/update_rule.h"
#include "tandem/train/train_config.h"

namespace tandem {

// `comm`: the ranks a rule with a collective phase exchanges with (DeMo); host updates run
// on `pool`.
std::unique_ptr<UpdateRule> make_update_rule(const OptimizerConfig& config,
                                             const ParamLayout& layout, Communicator& comm,
                                             ThreadPool& pool);

// The rule's state arrays beside the fp32 params, as a checkpoint names them (AdamW:
// exp_avg, exp_avg_sq; DeMo: delta), in the rule's order.
std::vector<std::string> optimizer_state_names(const OptimizerConfig& config);

// Whether every rank keeps state of its own for every parameter (DeMo's momentum), so a
// checkpoint holds one copy per rank, rather than one copy partitioned over the ranks.
bool optimizer_state_per_rank(const OptimizerConfig& config);

// Whether data parallelism reduces the gradients over the ranks before the update (AdamW),
// or the rule exchanges with the other ranks itself and each rank keeps its own (DeMo).
bool optimizer_reduces_gradients(const OptimizerConfig& config);

// fp32 state bytes per parameter, the master weights included (AdamW 12, DeMo 8).
size_t optimizer_state_bytes_per_param(const OptimizerConfig& config);

// Device bytes the rule's own device kernels need beside the state for `plan` (DeMo on a
// GPU: DCT matrices, scratch, messages; see DemoRule::device_workspace_bytes); 0 for most.
size_t optimizer_device_workspace_bytes(const OptimizerConfig& config, const ParamLayout& layout,
                                        const OffloadPlan& plan, int world_size, DeviceKind kind);

// The flat indices where offload subgroups may end (DeMo: every tensor's end, so that each
// tensor is updated whole at one site); empty when any index will do.
std::vector<size_t> subgroup_cut_points(const OptimizerConfig& config, const ParamLayout& layout);

}  // namespace tandem
