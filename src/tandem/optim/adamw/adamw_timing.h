// AdamW timed for the performance model (offload/perf_model.h): its rates on a device, and
// the state it is timed on.
#pragma once

#include <cstddef>
#include <functional>

#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/offload/perf_model.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

// calibrate_update_rates with AdamW, its CPU kernel on `pool`.
UpdateRates calibrate_adamw_rates(Device& device, ThreadPool& pool, size_t sample_params,
                                  const UpdateDTypes& types = {}, size_t pass_params = 0,
                                  const std::function<void()>& before_each_kind = {});

// Fills [params | m | v | grads] (4 x n floats at `state`, in any memory space of
// `device`) with values that time AdamW fairly: params 1, m and v 0, gradients 1e-3
// (no denormals, no overflow). Returns the arrays over them.
AdamWArrays fill_adamw_timing_state(Device& device, Stream& stream, float* state, size_t n);

}  // namespace tandem
