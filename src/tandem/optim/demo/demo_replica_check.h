// DeMo's replica check, its own step hook (optim/optimizer_family.h, OptimizerHooks): DeMo's
// replicas hold the same parameters bit for bit by construction (every rank decodes the
// same messages in the same order, optim/demo/demo.h), and every demo.replica_check_interval
// steps that updated the ranks prove it after the update (a collective), or stop with an
// error naming the step. No other optimizer has it: it comes with DeMo's row.
#pragma once

#include <memory>

#include "tandem/optim/optimizer_family.h"

namespace tandem {

// The hooks for a DeMo run (DeMo's row's make_hooks); null when the check is off
// (demo.replica_check_interval 0).
std::unique_ptr<OptimizerHooks> make_demo_replica_check(const OptimizerHookParts& parts);

}  // namespace tandem
