// Where each subgroup of the flat parameter space keeps its optimizer state and where
// its update runs (Deep Optimizer States, arXiv 2410.21316).
//
// The flat space is cut into subgroups of sub_group_size parameters. Each subgroup is
// updated at one site:
//   kHost:           fp32 params, m, v in pinned host memory; gradients copied to the
//                    host; updated by the CPU AdamW (ZeRO-Offload).
//   kDeviceResident: fp32 params, m, v stay in device memory and are updated there
//                    (Twin-Flow's static ratio; all of them: no offload).
//   kDeviceStaged:   state lives in pinned host memory, is prefetched into a device
//                    staging buffer, updated there and written back, overlapped with
//                    the CPU updating the kHost subgroups (interleaving).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/enum_names.h"
#include "tandem/model/param_range.h"

namespace tandem {

enum class UpdateSchedule {
  kDevice,      // no offload: every subgroup resident on the device
  kCpu,         // every update on the CPU
  kRatio,       // offload_optimizer.ratio of the subgroups resident on the device
  kInterleave,  // one subgroup in offload_optimizer.stride staged through the device
  kAuto,        // chosen by the performance model (perf_model.h) from measured rates
};
inline constexpr EnumName<UpdateSchedule> kUpdateScheduleNames[] = {
    {UpdateSchedule::kDevice, "device"},
    {UpdateSchedule::kCpu, "cpu"},
    {UpdateSchedule::kRatio, "ratio"},
    {UpdateSchedule::kInterleave, "interleave"},
    {UpdateSchedule::kAuto, "auto"}};
constexpr std::string_view update_schedule_name(UpdateSchedule schedule) {
  return enum_name(kUpdateScheduleNames, schedule);
}

enum class UpdateSite { kHost, kDeviceResident, kDeviceStaged };
inline constexpr EnumName<UpdateSite> kUpdateSiteNames[] = {
    {UpdateSite::kHost, "host"},
    {UpdateSite::kDeviceResident, "device-resident"},
    {UpdateSite::kDeviceStaged, "device-staged"}};
constexpr std::string_view update_site_name(UpdateSite site) {
  return enum_name(kUpdateSiteNames, site);
}

struct OffloadSettings {
  UpdateSchedule schedule = UpdateSchedule::kCpu;
  size_t sub_group_size = 100'000'000;  // zero_optimization.sub_group_size (parameters)
  double ratio = 0.5;                   // offload_optimizer.ratio, for kRatio: in [0, 1]
  int stride = 2;                       // offload_optimizer.stride k, for kInterleave: >= 1
  int staging_buffers = 2;              // device staging buffers for kDeviceStaged subgroups
  // offload_optimizer.overlap_forward: the update runs on behind UpdateEngine::step() while
  // the next forward waits block by block for the parameters it reads (update_engine.h).
  // Off here, where an engine is used alone; the training config turns it on.
  bool overlap_forward = false;
};

struct Subgroup {
  size_t begin = 0, end = 0;  // range of the flat parameter space
  UpdateSite site = UpdateSite::kHost;
  size_t size() const { return end - begin; }
};

struct OffloadPlan {
  OffloadSettings settings;
  size_t num_params = 0;  // of the whole model
  // The parameters whose optimizer state this plan holds and updates: all of them, or
  // one rank's ZeRO partition (zero/partition.h). The subgroups cut it from its start.
  ParamRange partition;
  std::vector<Subgroup> subgroups;
  size_t max_subgroup_size = 0;
  size_t count(UpdateSite site) const;
  size_t params_at(UpdateSite site) const;
};

// Cuts num_params into subgroups and assigns sites (kAuto: use make_auto_plan). Ratio: subgroup x
// is resident when floor((x+1) r) > floor(x r), which spreads the device subgroups evenly among the
// CPU ones. Interleave: subgroup x is staged when (x + 1) % stride == 0. Invalid settings throw
// tandem::Error naming the config key and the allowed range.
OffloadPlan make_offload_plan(const OffloadSettings& settings, size_t num_params);
// The same over one partition [begin, end) of the num_params parameters.
OffloadPlan make_offload_plan(const OffloadSettings& settings, size_t num_params,
                              ParamRange partition);
// The same with every subgroup ending on one of `cut_points` (ascending flat indices, such
// as the ends of the model's tensors) or at the partition's end: each subgroup runs to the
// first cut point at least sub_group_size past its start, so it holds whole tensors (an
// update rule that works per tensor, DeMo, needs them whole at one site).
OffloadPlan make_offload_plan(const OffloadSettings& settings, size_t num_params,
                              ParamRange partition, std::span<const size_t> cut_points);

// Bytes needed in each memory space by the update engine for a plan: device (working
// params, gradients, resident fp32 state, staging buffers), pinned host (offloaded
// fp32 state, host gradient buffers, working-copy staging).
struct TierBytes {
  size_t device = 0;
  size_t pinned_host = 0;
  size_t host = 0;
};
// `state_bytes_per_param`: the update rule's state (AdamW: fp32 params, m, v).
TierBytes engine_memory_needs(const OffloadPlan& plan, size_t working_bytes_per_param,
                              size_t grad_bytes_per_param, size_t state_bytes_per_param = 12);

}  // namespace tandem
