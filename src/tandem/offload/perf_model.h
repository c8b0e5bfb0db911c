// The performance model of the update phase: measured rates of this machine, the
// predicted time of a plan, and the `auto` schedule that picks the plan with the
// smallest predicted time that fits in device memory.
//
// Two lanes work at once. The host lane: the CPU updates the host subgroups, each one's new
// working parameters going back host-to-device behind it (the last one's copy is the lane's
// tail). The device lane: staged subgroups are prefetched (the rule's state, AdamW's 12 bytes
// per parameter), updated and written back, and resident ones updated, pipelined over the
// staging buffers (one buffer: one after another), with the host subgroups' working
// parameters on the same host-to-device link. The gradients of host subgroups move during
// backward, not in the update.
//
// The lanes share the host's memory bandwidth (the CPU's AdamW streams it; so does every
// PCIe copy) and, on the cpu device, its cores: while both run, each runs at the rates
// measured with everything running at once; once one lane is done, the other goes on at its
// rates alone. So, with each lane's time alone (H, D) and at the shared rates (H', D'):
//   H' <= D':  time = H' + (1 - H'/D') D      (the device lane did H'/D' of its work)
//   H' >  D':  time = D' + (1 - D'/H') H
// Without shared rates (or with one lane empty) this is max(H, D). Beside a device lane of
// working copies alone (the cpu schedule), which takes less of the host than staging does,
// the rates are those measured with the CPU and host-to-device copies alone (shared_h2d).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/update_rule.h"

namespace tandem {

// The rates of the update's four kinds of work while all of them run at once.
struct SharedRates {
  double cpu_params_per_s = 0;
  double device_params_per_s = 0;
  double h2d_bytes_per_s = 0;
  double d2h_bytes_per_s = 0;
  bool measured() const { return cpu_params_per_s > 0; }
};

struct UpdateRates {
  double cpu_params_per_s = 0;        // the rule's CPU kernel on the whole thread pool
  double device_params_per_s = 0;     // the rule's device kernel
  size_t state_bytes_per_param = 12;  // the rule's state (AdamW: fp32 params, m, v)
  double h2d_bytes_per_s = 0;         // pinned host -> device
  double d2h_bytes_per_s = 0;         // device -> pinned host
  // A host subgroup's new working parameters, host-to-device (fp32 4, bf16 or fp16 2).
  size_t working_bytes_per_param = 4;
  // The same rates with the CPU update, both copies and the device update running at once;
  // unmeasured (zero): the rates alone.
  SharedRates shared = {};
  // The CPU's and the host-to-device link's with the two alone at once (the cpu schedule's
  // lanes: CPU updates and their working copies); the others alone. Unmeasured: `shared`.
  SharedRates shared_h2d = {};
  // Ranks that measured these at once, sharing the host's cores and memory (as a run's ranks
  // on one machine update at once): each rate is the slowest rank's. 1: measured alone.
  int ranks_at_once = 1;
  // The rates of a lane while the other lane works too: beside a device lane of
  // host-to-device copies only, or beside all of its work.
  UpdateRates while_shared(bool device_lane_copies_only = false) const;
  std::string to_text() const;
};

// The types a run's update reads and writes besides the fp32 state: its gradients, and the
// working copy of the parameters it writes for the model (16-bit: in the update's pass; fp32:
// copied from the params on the device, and the params themselves on the host).
struct UpdateDTypes {
  GradDType grads = GradDType::kF32;
  WorkingDType working = WorkingDType::kF32;
};

// Measures the rates of `rule` on `sample_params` parameters, updating as the engine does
// for `types`, each pass `pass_params` of them (a subgroup's size; 0: all), each pass the
// next slice: each kind of work alone (median of a few passes), then beside the CPU's passes
// (SharedRates: the copies and device updates repeating on threads of their own).
// `before_each_kind`, where given, runs before each kind of work is timed: ranks calibrating
// at once pass a barrier there, so that each kind runs on all of them at the same time.
UpdateRates calibrate_update_rates(Device& device, UpdateRule& rule, size_t sample_params,
                                   const UpdateDTypes& types = {}, size_t pass_params = 0,
                                   const std::function<void()>& before_each_kind = {});
// (AdamW's: optim/adamw/adamw_timing.h.)

struct UpdatePrediction {
  double seconds = 0;
  // Each lane alone: the host's (the CPU updates and the last working copy) and the
  // device's (pipelined copies and updates), and the device lane's parts.
  double host_seconds = 0, device_seconds = 0;
  double h2d_seconds = 0, d2h_seconds = 0, compute_seconds = 0;
  // How long both lanes ran at once (at the shared rates).
  double overlap_seconds = 0;
  // "predicted update time: 12.3 ms (CPU 10.1 ms, device 8.2 ms alone; both at once for 7.9 ms)"
  std::string to_text() const;
};
UpdatePrediction predict_update(const OffloadPlan& plan, const UpdateRates& rates);

// offload_optimizer.overlap_forward: how much of a predicted update the next forward hides.
// Each lane finishes its subgroups evenly over its time, in flat order (the slower lane ends
// at prediction.seconds, the other as much earlier as its time alone is shorter), and the
// forward, `forward_seconds` spread evenly over the partition's parameters, reads them in
// flat order, each once its subgroup is done. With U the update and subgroup k done at t_k
// from its begin b_k, the forward ends at max(F, max_k t_k + F (P - b_k) / P), where it
// would end at U + F without overlap: the update hidden is the difference (at most F).
double predict_hidden_update(const OffloadPlan& plan, const UpdatePrediction& prediction,
                             double forward_seconds);

// The `auto` schedule: for 0 up to offload_optimizer.staging_buffers staging buffers that
// fit in `device_bytes_for_state`, each number of subgroups resident on the device that the
// rest of it holds (none included), and among the others each interleave stride (or none):
// the plan with the smallest predicted update time.
OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params,
                           const UpdateRates& rates, size_t device_bytes_for_state);
// The same over one partition of the parameters (a rank's, under ZeRO).
OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params, ParamRange partition,
                           const UpdateRates& rates, size_t device_bytes_for_state);

}  // namespace tandem
