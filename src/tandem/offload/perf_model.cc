#include "tandem/offload/perf_model.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "tandem/core/timer.h"
#include "tandem/optim/adamw_rule.h"

namespace tandem {
namespace {

constexpr int kPasses = 3;

}  // namespace

std::string UpdateRates::to_text() const {
  return cat("CPU update ", cpu_params_per_s / 1e9, " G params/s, device update ",
             device_params_per_s / 1e9, " G params/s, host-to-device ", h2d_bytes_per_s / 1e9,
             " GB/s, device-to-host ", d2h_bytes_per_s / 1e9, " GB/s");
}

AdamWArrays fill_adamw_timing_state(Device& device, Stream& stream, float* state, size_t n) {
  std::vector<float> init(4 * n, 0.0f);
  std::fill(init.begin(), init.begin() + n, 1.0f);
  std::fill(init.begin() + 3 * n, init.end(), 1e-3f);
  device.copy_async(state, init.data(), init.size() * sizeof(float), stream);
  stream.synchronize();
  AdamWArrays arrays;
  arrays.params = state;
  arrays.m = state + n;
  arrays.v = state + 2 * n;
  arrays.grads = state + 3 * n;
  return arrays;
}

UpdateRates calibrate_update_rates(Device& device, UpdateRule& rule, size_t sample_params) {
  const size_t n = std::max<size_t>(sample_params, 1024);
  const size_t arrays = rule.state_floats();
  const size_t bytes = n * arrays * sizeof(float);
  // [state arrays | grads] in each space: params 1, the rest of the state 0, gradients
  // 1e-3 (no denormals, no overflow).
  DeviceAllocation host = device.allocate(MemorySpace::kPinnedHost, bytes + n * sizeof(float));
  DeviceAllocation dev = device.allocate(MemorySpace::kDevice, bytes + n * sizeof(float));
  auto stream = device.create_stream("calibration");
  std::vector<float> init((arrays + 1) * n, 0.0f);
  std::fill(init.begin(), init.begin() + n, 1.0f);
  std::fill(init.end() - n, init.end(), 1e-3f);
  for (DeviceAllocation* a : {&host, &dev})
    device.copy_async(a->data(), init.data(), init.size() * sizeof(float), *stream);
  stream->synchronize();
  auto over = [&](DeviceAllocation& a) {
    RuleArrays r;
    r.state = a.as<float>();
    r.size = n;
    r.grads = a.as<float>() + arrays * n;
    return r;
  };
  const RuleArrays on_host = over(host), on_device = over(dev);
  const UpdateSegment all{0, n, true};
  rule.begin_step(1, 1e-4f, 1.0f);
  UpdateRates rates;
  rates.state_bytes_per_param = arrays * sizeof(float);
  rates.cpu_params_per_s = n / best_seconds(kPasses, [&] {
                             rule.update_on_host(on_host, {&all, 1});
                           });
  rates.device_params_per_s =
      n / best_seconds(kPasses, [&] {
        device.launch_async(rule.device_update(on_device, {&all, 1}), *stream);
        stream->synchronize();
      });
  rates.h2d_bytes_per_s = bytes / best_seconds(kPasses, [&] {
                            device.copy_async(dev.data(), host.data(), bytes, *stream);
                            stream->synchronize();
                          });
  rates.d2h_bytes_per_s = bytes / best_seconds(kPasses, [&] {
                            device.copy_async(host.data(), dev.data(), bytes, *stream);
                            stream->synchronize();
                          });
  return rates;
}

UpdateRates calibrate_update_rates(Device& device, ThreadPool& pool, size_t sample_params) {
  AdamWRule adamw(AdamWHyper{.lr = 1e-4f, .weight_decay = 0.01f}, pool);
  return calibrate_update_rates(device, adamw, sample_params);
}

UpdatePrediction predict_update(const OffloadPlan& plan, const UpdateRates& rates) {
  const double host = static_cast<double>(plan.params_at(UpdateSite::kHost));
  const double resident = static_cast<double>(plan.params_at(UpdateSite::kDeviceResident));
  const double staged = static_cast<double>(plan.params_at(UpdateSite::kDeviceStaged));
  UpdatePrediction p;
  p.host_seconds = host / rates.cpu_params_per_s;
  const auto state_bytes = static_cast<double>(rates.state_bytes_per_param);
  p.h2d_seconds = (host * sizeof(float) + staged * state_bytes) / rates.h2d_bytes_per_s;
  p.d2h_seconds = (host * sizeof(float) + staged * state_bytes) / rates.d2h_bytes_per_s;
  p.compute_seconds = (resident + staged) / rates.device_params_per_s;
  if (plan.settings.staging_buffers >= 2 || staged == 0) {
    p.device_seconds = std::max({p.h2d_seconds, p.d2h_seconds, p.compute_seconds});
  } else {
    // One staging buffer: prefetch, update and write-back of staged subgroups serialise.
    p.device_seconds = staged * state_bytes / rates.h2d_bytes_per_s +
                       staged * state_bytes / rates.d2h_bytes_per_s + p.compute_seconds;
  }
  p.seconds = std::max(p.host_seconds, p.device_seconds);
  return p;
}

namespace {

// Residency within `budget`, then the best stride over `slots` staging buffers.
OffloadPlan best_plan_with_slots(const OffloadPlan& all_host, const UpdateRates& rates,
                                 size_t budget, int slots) {
  OffloadPlan plan = all_host;
  const size_t state_bytes = rates.state_bytes_per_param;
  for (Subgroup& s : plan.subgroups) {
    if (s.size() * state_bytes > budget) continue;
    s.site = UpdateSite::kDeviceResident;
    budget -= s.size() * state_bytes;
  }
  plan.settings.staging_buffers = std::max(slots, 1);
  if (slots == 0) return plan;
  OffloadPlan best = plan;
  double best_time = predict_update(plan, rates).seconds;
  for (int stride = 1; stride <= 16; stride++) {
    OffloadPlan candidate = plan;
    int x = 0;
    for (Subgroup& s : candidate.subgroups) {
      if (s.site != UpdateSite::kHost) continue;
      if (++x % stride == 0) s.site = UpdateSite::kDeviceStaged;
    }
    candidate.settings.stride = stride;
    const double seconds = predict_update(candidate, rates).seconds;
    if (seconds < best_time) {
      best_time = seconds;
      best = candidate;
    }
  }
  return best;
}

}  // namespace

OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params,
                           const UpdateRates& rates, size_t device_bytes_for_state) {
  return make_auto_plan(settings, num_params, ParamRange{0, num_params}, rates,
                        device_bytes_for_state);
}

OffloadPlan make_auto_plan(const OffloadSettings& settings, size_t num_params, ParamRange partition,
                           const UpdateRates& rates, size_t device_bytes_for_state) {
  OffloadSettings base = settings;
  base.schedule = UpdateSchedule::kCpu;
  OffloadPlan all_host = make_offload_plan(base, num_params, partition);
  all_host.settings.schedule = UpdateSchedule::kAuto;
  // Keeping state resident saves 24 bytes of transfers per parameter and step, but the
  // memory could instead hold staging buffers that put many more subgroups through the
  // device: try each number of staging buffers and keep the fastest prediction.
  const size_t slot_bytes = all_host.max_subgroup_size * rates.state_bytes_per_param;
  OffloadPlan best = best_plan_with_slots(all_host, rates, device_bytes_for_state, 0);
  double best_time = predict_update(best, rates).seconds;
  for (int slots = 1; slots <= std::max(settings.staging_buffers, 1); slots++) {
    if (slots * slot_bytes > device_bytes_for_state) break;
    const OffloadPlan candidate =
        best_plan_with_slots(all_host, rates, device_bytes_for_state - slots * slot_bytes, slots);
    const double seconds = predict_update(candidate, rates).seconds;
    if (seconds < best_time) {
      best_time = seconds;
      best = candidate;
    }
  }
  return best;
}

}  // namespace tandem
