// The performance model of the update phase: measured rates of this machine, the
// predicted time of a plan, and the `auto` schedule that picks the plan with the
// smallest predicted time that fits in device memory.
//
// Per parameter, a CPU update costs 1 / cpu rate; a staged device update moves the rule's
// state each way (AdamW: 12 bytes, fp32 params, m, v) and costs 1 / device rate; a resident device
// update costs only 1 / device rate. CPU-updated subgroups also move their gradients device-to-host
// and their new working parameters host-to-device (4 bytes each way). The CPU and the device work
// concurrently, and with two or more staging buffers the prefetch, update and write-back of
// consecutive staged subgroups pipeline, so
//   time = max(host time, max(h2d time, d2h time, device compute time)).
#pragma once

#include <cstddef>
#include <string>

#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/update_rule.h"
#include "tandem/optim/adamw_reference.h"

namespace tandem {

struct UpdateRates {
  double cpu_params_per_s = 0;        // the rule's CPU kernel on the whole thread pool
  double device_params_per_s = 0;     // the rule's device kernel
  size_t state_bytes_per_param = 12;  // the rule's state (AdamW: fp32 params, m, v)
  double h2d_bytes_per_s = 0;         // pinned host -> device
  double d2h_bytes_per_s = 0;         // device -> pinned host
  std::string to_text() const;
};

// Measures the rates of `rule` with `sample_params` parameters (best of a few passes).
UpdateRates calibrate_update_rates(Device& device, UpdateRule& rule, size_t sample_params);
// The same for AdamW, its CPU kernel on `pool`.
UpdateRates calibrate_update_rates(Device& device, ThreadPool& pool, size_t sample_params);

// Fills [params | m | v | grads] (4 x n floats at `state`, in any memory space of
// `device`) with values that time AdamW fairly: params 1, m and v 0, gradients 1e-3
// (no denormals, no overflow). Returns the arrays over them.
AdamWArrays fill_adamw_timing_state(Device& device, Stream& stream, float* state, size_t n);

struct UpdatePrediction {
  double seconds = 0;
  double host_seconds = 0, device_seconds = 0;
  double h2d_seconds = 0, d2h_seconds = 0, compute_seconds = 0;
};
UpdatePrediction predict_update(const OffloadPlan& plan, const UpdateRates& rates);

// The `auto` schedule: for 0 up to offload_optimizer.staging_buffers staging buffers
// that fit in `device_bytes_for_state`, as many subgroups resident on the device as the
// rest of it allows (they need no transfers), and among the others the interleave
// stride (or none) with the smallest predicted update time; the fastest of these.
OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params,
                           const UpdateRates& rates, size_t device_bytes_for_state);
// The same over one partition of the parameters (a rank's, under ZeRO).
OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params, ParamRange partition,
                           const UpdateRates& rates, size_t device_bytes_for_state);

}  // namespace tandem
