#include "tandem/offload/offload_plan.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"

namespace tandem {

size_t OffloadPlan::count(UpdateSite site) const {
  return static_cast<size_t>(std::count_if(subgroups.begin(), subgroups.end(),
                                           [&](const Subgroup& s) { return s.site == site; }));
}

size_t OffloadPlan::params_at(UpdateSite site) const {
  size_t total = 0;
  for (const Subgroup& s : subgroups)
    if (s.site == site) total += s.size();
  return total;
}

OffloadPlan make_offload_plan(const OffloadSettings& settings, size_t num_params) {
  return make_offload_plan(settings, num_params, ParamRange{0, num_params});
}

OffloadPlan make_offload_plan(const OffloadSettings& settings, size_t num_params,
                              ParamRange partition) {
  return make_offload_plan(settings, num_params, partition, {});
}

OffloadPlan make_offload_plan(const OffloadSettings& settings, size_t num_params,
                              ParamRange partition, std::span<const size_t> cut_points) {
  TANDEM_CHECK(std::is_sorted(cut_points.begin(), cut_points.end()),
               "make_offload_plan: cut points must be ascending");
  TANDEM_CHECK(partition.begin <= partition.end && partition.end <= num_params, "partition [",
               partition.begin, ", ", partition.end, ") is not inside the ", num_params,
               " parameters");
  TANDEM_CHECK(settings.sub_group_size >= 1,
               "zero_optimization.sub_group_size must be at least 1 parameter");
  TANDEM_CHECK(settings.schedule != UpdateSchedule::kRatio ||
                   (settings.ratio >= 0.0 && settings.ratio <= 1.0),
               "offload_optimizer.ratio = ", settings.ratio,
               " is out of range; allowed: 0 to 1 "
               "(the fraction of subgroups whose state stays on the device)");
  TANDEM_CHECK(settings.schedule != UpdateSchedule::kInterleave || settings.stride >= 1,
               "offload_optimizer.stride = ", settings.stride,
               " is out of range; allowed: 1 or more (one subgroup in `stride` is updated on the "
               "device)");
  TANDEM_CHECK(settings.staging_buffers >= 1,
               "offload_optimizer.staging_buffers = ", settings.staging_buffers,
               " is out of range; allowed: 1 or more");
  TANDEM_CHECK(settings.schedule != UpdateSchedule::kAuto,
               "the 'auto' schedule needs measured rates: use make_auto_plan");
  OffloadPlan plan;
  plan.settings = settings;
  plan.num_params = num_params;
  plan.partition = partition;
  for (size_t begin = partition.begin, x = 0; begin < partition.end; x++) {
    Subgroup s;
    s.begin = begin;
    s.end = std::min(partition.end, begin + settings.sub_group_size);
    if (!cut_points.empty()) {
      const auto cut = std::lower_bound(cut_points.begin(), cut_points.end(), s.end);
      s.end = cut == cut_points.end() ? partition.end : std::min(partition.end, *cut);
    }
    begin = s.end;
    switch (settings.schedule) {
      case UpdateSchedule::kDevice:
        s.site = UpdateSite::kDeviceResident;
        break;
      case UpdateSchedule::kCpu:
        s.site = UpdateSite::kHost;
        break;
      case UpdateSchedule::kRatio: {
        const bool resident =
            std::floor((x + 1) * settings.ratio + 1e-9) > std::floor(x * settings.ratio + 1e-9);
        s.site = resident ? UpdateSite::kDeviceResident : UpdateSite::kHost;
        break;
      }
      case UpdateSchedule::kInterleave:
        s.site = (x + 1) % settings.stride == 0 ? UpdateSite::kDeviceStaged : UpdateSite::kHost;
        break;
      case UpdateSchedule::kAuto:
        break;
    }
    plan.max_subgroup_size = std::max(plan.max_subgroup_size, s.size());
    plan.subgroups.push_back(s);
  }
  return plan;
}

TierBytes engine_memory_needs(const OffloadPlan& plan, size_t working_bytes_per_param,
                              size_t grad_bytes_per_param, size_t state_bytes_per_param) {
  const size_t state_bytes = state_bytes_per_param;
  TierBytes bytes;
  bytes.device = plan.num_params * (working_bytes_per_param + grad_bytes_per_param) +
                 plan.params_at(UpdateSite::kDeviceResident) * state_bytes;
  if (plan.count(UpdateSite::kDeviceStaged) > 0) {
    const size_t slots =
        std::min<size_t>(plan.settings.staging_buffers, plan.count(UpdateSite::kDeviceStaged));
    bytes.device += slots * plan.max_subgroup_size * state_bytes;
  }
  const size_t offloaded =
      plan.params_at(UpdateSite::kHost) + plan.params_at(UpdateSite::kDeviceStaged);
  const size_t host_updated = plan.params_at(UpdateSite::kHost);
  bytes.pinned_host =
      offloaded * state_bytes + host_updated * (grad_bytes_per_param + working_bytes_per_param);
  return bytes;
}

}  // namespace tandem
