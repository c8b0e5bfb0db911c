#include "tandem/config/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "tandem/comm/agreement.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/host_memory.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/model/model_family.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/zero/data_parallel.h"
#include "tandem/zero/partition.h"

namespace tandem {
namespace {

void add_up_tiers(TrainingMemoryPlan& plan) {
  const TierBytes engine = engine_memory_needs(plan.offload, plan.model_elem_bytes,
                                               plan.model_elem_bytes, plan.state_bytes_per_param);
  // engine_memory_needs counts a full working copy and gradient buffer; the model's are
  // counted in model_bytes (padded, or partitioned).
  plan.optimizer_device_bytes =
      engine.device - plan.num_params * 2 * plan.model_elem_bytes + plan.rule_workspace_bytes;
  plan.total.device = plan.activation_bytes + plan.model_bytes + plan.zero_buffer_bytes +
                      plan.optimizer_device_bytes;
  plan.total.pinned_host = engine.pinned_host + plan.activation_host_bytes;
  // The checkpoint snapshot: the fp32 state gathered when a checkpoint is written (lazy
  // checkpoints keep it for the run), or the pool it streams through.
  const CheckpointSnapshotPlan& snapshot = plan.snapshot;
  if (snapshot.streamed) {
    plan.total.pinned_host += snapshot.pool_bytes();
    plan.total.host = 0;
  } else {
    const size_t copy = plan.num_params * plan.state_bytes_per_param;
    if (plan.pinned_snapshot) plan.total.pinned_host += copy;
    plan.total.host = copy;
  }
}

// Full copies when they fit the snapshot's budget, else the pool (see CheckpointSnapshotPlan).
CheckpointSnapshotPlan plan_snapshot(const TrainConfig& config, const TrainingMemoryPlan& plan,
                                     DeviceKind device_kind) {
  CheckpointSnapshotPlan out;
  out.full_bytes = plan.num_params * plan.state_bytes_per_param * (plan.pinned_snapshot ? 2 : 1);
  const size_t mib = size_t{1} << 20;
  const bool automatic = config.train.checkpoint_memory_mb == 0;
  out.automatic = automatic;
  if (automatic) {
    // What the machine has left once the other tiers are in (the cpu device's "device"
    // memory is host memory too), less a tenth for everything else.
    const size_t machine = host_memory_bytes() / 10 * 9;
    const size_t others =
        plan.total.pinned_host + (device_kind == DeviceKind::kHostOnly ? plan.total.device : 0);
    // At least the smallest pool: with less left, the plan's host check names what to change
    // (this setting would not help).
    out.budget =
        std::max(machine > others ? machine - others : 0, CheckpointSnapshotPlan::kMinPoolBytes);
  } else {
    out.budget = static_cast<size_t>(config.train.checkpoint_memory_mb * static_cast<double>(mib));
  }
  if (out.full_bytes <= out.budget) return out;
  out.streamed = true;
  const size_t pool =
      automatic ? std::min(out.budget, CheckpointSnapshotPlan::kDefaultPoolBytes) : out.budget;
  const size_t floats_per_param = plan.state_bytes_per_param / sizeof(float);
  out.pool_slots = CheckpointSnapshotPlan::kPoolSlots;
  // Whole parameters per slot, and no more than the largest subgroup's state.
  const size_t slot_params = std::min(pool / out.pool_slots / plan.state_bytes_per_param,
                                      std::max<size_t>(plan.offload.max_subgroup_size, 1));
  out.pool_slot_floats = slot_params * floats_per_param;
  return out;
}

// Every tier, the snapshot chosen for what the others leave.
void add_up(TrainingMemoryPlan& plan, const TrainConfig& config, DeviceKind device_kind) {
  plan.snapshot = CheckpointSnapshotPlan{.streamed = true};  // an empty pool: the others only
  add_up_tiers(plan);
  plan.snapshot = plan_snapshot(config, plan, device_kind);
  add_up_tiers(plan);
}

}  // namespace

std::unique_ptr<Device> make_training_device(const TrainConfig& config, int cuda_device_index,
                                             const CpuDeviceOptions& injected) {
  const auto budget = static_cast<size_t>(config.device.memory_gb * (1ull << 30));
  if (config.device.type == DeviceKind::kCuda)
    return make_cuda_device({.device_index = cuda_device_index, .memory_bytes = budget});
  CpuDeviceOptions options = injected;
  options.memory_bytes = budget;
  return make_cpu_device(options);
}

TrainingMemoryPlan plan_training(const TrainConfig& config, Device& device, ThreadPool& pool) {
  const auto P = static_cast<size_t>(config.model.num_parameters());
  return plan_training(config, device, pool, ParamRange{0, P});
}

ParamRange zero_state_range(const TrainConfig& config, int world_size, int rank) {
  const auto P = static_cast<size_t>(config.model.num_parameters());
  if (config.zero.stage == 0) return {0, P};
  return ZeroPartition(P, world_size).range(rank);
}

size_t TrainingMemoryPlan::model_state_bytes() const {
  return model_bytes + offload.partition.size() * state_bytes_per_param;
}

namespace {

// The plan's memory on a device of `kind` and `capacity` bytes, before any rate is known
// (`auto` costed as all-CPU).
TrainingMemoryPlan plan_memory(const TrainConfig& config, DeviceKind kind, size_t capacity,
                               ParamRange state_range, int world_size) {
  TrainingMemoryPlan plan;
  plan.world_size = world_size;
  plan.zero_stage = config.zero.stage;
  plan.num_params = static_cast<size_t>(config.model.num_parameters());
  plan.device_capacity = capacity;
  plan.recompute_interval = config.activation_checkpointing.interval;
  const bool kept_on_host = config.activation_checkpointing.cpu_checkpointing;
  plan.activation_bytes =
      model_activation_bytes(config.model, config.micro_batch_size, config.seq_len(),
                             config.storage_dtype(), plan.recompute_interval, kept_on_host);
  if (kept_on_host)
    plan.activation_host_bytes =
        model_kept_output_host_bytes(config.model, config.micro_batch_size, config.seq_len(),
                                     config.storage_dtype(), plan.recompute_interval);
  plan.activation_bytes_without_recompute = model_activation_bytes(
      config.model, config.micro_batch_size, config.seq_len(), config.storage_dtype());
  plan.model_elem_bytes = storage_dtype_bytes(config.storage_dtype());
  // Working params (padded to world_size equal partitions at ZeRO stages 1 and 2, this
  // rank's partition at 3) + gradients (all below stage 2, this rank's partition from it).
  const int stage = config.zero.stage;
  const size_t e = plan.model_elem_bytes;
  const size_t S = ZeroPartition(plan.num_params, world_size).partition_size();
  const size_t params_held =
      stage == 3 ? S : DataParallel::working_params_capacity(plan.num_params, world_size, stage);
  const size_t grads_held = DataParallel::model_holds_gradients(stage) ? plan.num_params : S;
  plan.model_bytes = (params_held + grads_held) * e;
  if (stage >= 2) {
    const size_t partitioned = DataParallel::partitioned_bytes(
        model_layout(config.model).blocks(), plan.num_params, world_size, config.zero,
        config.storage_dtype(), config.gradient_accumulation_steps);
    plan.zero_buffer_bytes = partitioned - (stage == 3 ? 2 * S : S) * e;
  }
  const bool automatic = config.offload.schedule == UpdateSchedule::kAuto;
  // Until the rates are known, `auto` is costed as its least demanding choice (all CPU).
  OffloadSettings fixed = config.offload;
  if (automatic) fixed.schedule = UpdateSchedule::kCpu;
  const OptimizerFamily& family = optimizer_family(config.optimizer.type);
  plan.state_bytes_per_param = family.state_bytes_per_param();
  plan.machine_host_bytes = host_memory_bytes();
  plan.device_is_host = kind == DeviceKind::kHostOnly;
  plan.pinned_snapshot = config.train.lazy_checkpoints && kind == DeviceKind::kCuda;
  plan.state_names = family.state_label;
  const ParamLayout layout = model_layout(config.model);
  plan.offload =
      make_offload_plan(fixed, plan.num_params, state_range, family.subgroup_cut_points(layout));
  plan.rule_workspace_bytes =
      family.workspace_bytes(config.optimizer, layout, plan.offload, world_size, kind);
  add_up(plan, config, kind);
  return plan;
}

// With the rates known: the performance model's plan for `auto`, and the prediction.
void finish_plan(TrainingMemoryPlan& plan, const TrainConfig& config, DeviceKind kind,
                 ParamRange state_range, const UpdateRates& rates) {
  plan.rates = rates;
  plan.rates.working_bytes_per_param = plan.model_elem_bytes;
  if (config.offload.schedule == UpdateSchedule::kAuto) {
    const size_t taken = plan.activation_bytes + plan.model_bytes + plan.zero_buffer_bytes;
    plan.offload = make_auto_plan(config.offload, plan.num_params, state_range, plan.rates,
                                  plan.device_capacity - taken);
    add_up(plan, config, kind);
  }
  plan.prediction = predict_update(plan.offload, plan.rates);
}

// What the run's update reads and writes besides the fp32 state.
UpdateDTypes update_dtypes(const TrainConfig& config) {
  const bool bf16 = config.bf16;
  return {.grads = bf16 ? GradDType::kBF16 : GradDType::kF32,
          .working = bf16 ? WorkingDType::kBF16 : WorkingDType::kF32};
}

// The parameters an AdamW timing sample takes: enough that the CPU streams them from
// memory as the real update does, few enough for well under a second.
size_t timing_sample(const TrainingMemoryPlan& plan, size_t device_free) {
  // 2^25 parameters are 512 MiB, beyond the last-level cache a process sees on today's
  // servers: 2^22 (64 MiB) stayed in the cache of the first GPU machine and measured the
  // CPU at 10.9 G params/s against 4.3 G in training, so `auto` put too much on it.
  const size_t sample = std::clamp<size_t>(plan.num_params, size_t{1} << 16, size_t{1} << 25);
  return std::min(sample, device_free / (2 * 4 * sizeof(float)));
}

void keep_slower(double& kept, double other) { kept = std::min(kept, other); }
void keep_slower(SharedRates& kept, const SharedRates& other) {
  keep_slower(kept.cpu_params_per_s, other.cpu_params_per_s);
  keep_slower(kept.device_params_per_s, other.device_params_per_s);
  keep_slower(kept.h2d_bytes_per_s, other.h2d_bytes_per_s);
  keep_slower(kept.d2h_bytes_per_s, other.d2h_bytes_per_s);
}

// Every rank's rates (every rank calls it), each the slowest rank's: ranks that train together
// wait for the slowest at the step's collectives.
UpdateRates slowest_rank(Communicator& peers, const UpdateRates& mine) {
  static_assert(std::is_trivially_copyable_v<UpdateRates>);
  std::vector<UpdateRates> all(static_cast<size_t>(peers.world_size()));
  peers.all_gather(&mine, all.data(), sizeof mine);
  UpdateRates slowest = mine;
  for (const UpdateRates& r : all) {
    keep_slower(slowest.cpu_params_per_s, r.cpu_params_per_s);
    keep_slower(slowest.device_params_per_s, r.device_params_per_s);
    keep_slower(slowest.h2d_bytes_per_s, r.h2d_bytes_per_s);
    keep_slower(slowest.d2h_bytes_per_s, r.d2h_bytes_per_s);
    keep_slower(slowest.shared, r.shared);
    keep_slower(slowest.shared_h2d, r.shared_h2d);
  }
  slowest.ranks_at_once = peers.world_size();
  return slowest;
}

}  // namespace

std::optional<UpdateRates> measure_update_rates(const TrainConfig& config, Device& device,
                                                ThreadPool& pool, ParamRange state_range,
                                                int world_size, Communicator* peers) {
  if (peers != nullptr && peers->world_size() == 1) peers = nullptr;
  const TrainingMemoryPlan plan =
      plan_memory(config, device.kind(), device.device_capacity(), state_range, world_size);
  // Nothing to time where the run cannot start, or for a rule the performance model cannot
  // time (a fixed plan, no `auto`).
  const OptimizerFamily& family = optimizer_family(config.optimizer.type);
  size_t sample = plan.fits() && family.calibrate_rates != nullptr
                      ? timing_sample(plan, device.device_free())
                      : 0;
  size_t pass = plan.offload.max_subgroup_size;
  if (peers != nullptr) {
    // The same work on every rank, so that each kind runs on all at once: the smallest sample
    // (none where any rank has nothing to time), in rank 0's subgroups.
    sample = min_over_ranks(*peers, sample);
    peers->broadcast(&pass, sizeof pass, 0);
  }
  if (sample < 1024) return std::nullopt;
  if (peers == nullptr)
    return family.calibrate_rates(device, pool, sample, update_dtypes(config), pass, {});
  const UpdateRates mine = family.calibrate_rates(device, pool, sample, update_dtypes(config), pass,
                                                  [peers] { peers->barrier(); });
  return slowest_rank(*peers, mine);
}

TrainingMemoryPlan plan_training_at_rates(const TrainConfig& config, DeviceKind kind,
                                          size_t capacity, ParamRange state_range, int world_size,
                                          const std::optional<UpdateRates>& rates) {
  TrainingMemoryPlan plan = plan_memory(config, kind, capacity, state_range, world_size);
  if (plan.fits() && rates) finish_plan(plan, config, kind, state_range, *rates);
  return plan;
}

TrainingMemoryPlan plan_training(const TrainConfig& config, Device& device, ThreadPool& pool,
                                 ParamRange state_range, int world_size, Communicator* peers) {
  return plan_training_at_rates(
      config, device.kind(), device.device_capacity(), state_range, world_size,
      measure_update_rates(config, device, pool, state_range, world_size, peers));
}

namespace {

TrainConfig planned_for_gpu_machine(const TrainConfig& config) {
  // The GPU machine's host memory is unknown here: an automatic snapshot budget is
  // planned as the default pool, not as what this machine has left.
  TrainConfig planned = config;
  if (planned.train.checkpoint_memory_mb == 0)
    planned.train.checkpoint_memory_mb =
        static_cast<double>(CheckpointSnapshotPlan::kDefaultPoolBytes >> 20);
  return planned;
}

}  // namespace

std::optional<UpdateRates> assumed_gpu_update_rates(const TrainConfig& config, ThreadPool& pool,
                                                    ParamRange state_range, int world_size,
                                                    const AssumedGpu& gpu) {
  const TrainConfig planned = planned_for_gpu_machine(config);
  const auto capacity = static_cast<size_t>(config.device.memory_gb * (1ull << 30));
  const TrainingMemoryPlan plan =
      plan_memory(planned, DeviceKind::kCuda, capacity, state_range, world_size);
  const OptimizerFamily& family = optimizer_family(config.optimizer.type);
  if (family.calibrate_rates == nullptr) return std::nullopt;
  UpdateRates rates;
  rates.state_bytes_per_param = plan.state_bytes_per_param;
  rates.cpu_params_per_s = gpu.cpu_params_per_s;
  if (rates.cpu_params_per_s == 0) {
    // This machine's, measured on a host-only device of the sample's size.
    const size_t sample = timing_sample(plan, std::numeric_limits<size_t>::max());
    auto host = make_cpu_device({.memory_bytes = 2 * 4 * sizeof(float) * sample});
    rates = family.calibrate_rates(*host, pool, sample, update_dtypes(config),
                                   plan.offload.max_subgroup_size, {});
  }
  rates.device_params_per_s = gpu.for_optimizer(family).update_params_per_s;
  rates.h2d_bytes_per_s = gpu.h2d_bytes_per_s;
  rates.d2h_bytes_per_s = gpu.d2h_bytes_per_s;
  // What this machine's host-only device measured beside its CPU says nothing of a GPU's
  // DMA: the assumed GPU's plan is costed at the rates alone.
  rates.shared = {};
  rates.shared_h2d = {};
  return rates;
}

TrainingMemoryPlan plan_training_on_assumed_gpu(const TrainConfig& config,
                                                const std::optional<UpdateRates>& rates,
                                                ParamRange state_range, int world_size,
                                                const AssumedGpu& gpu) {
  const auto capacity = static_cast<size_t>(config.device.memory_gb * (1ull << 30));
  TrainingMemoryPlan plan = plan_training_at_rates(
      planned_for_gpu_machine(config), DeviceKind::kCuda, capacity, state_range, world_size, rates);
  plan.gpu_assumed = gpu.for_optimizer(optimizer_family(config.optimizer.type));
  plan.machine_host_bytes = 0;  // the GPU machine's, unknown here
  return plan;
}

TrainingMemoryPlan plan_training_without_gpu(const TrainConfig& config, ThreadPool& pool,
                                             ParamRange state_range, int world_size,
                                             const AssumedGpu& gpu) {
  const auto capacity = static_cast<size_t>(config.device.memory_gb * (1ull << 30));
  const bool fits = plan_memory(planned_for_gpu_machine(config), DeviceKind::kCuda, capacity,
                                state_range, world_size)
                        .fits();
  return plan_training_on_assumed_gpu(
      config,
      fits ? assumed_gpu_update_rates(config, pool, state_range, world_size, gpu) : std::nullopt,
      state_range, world_size, gpu);
}

namespace {

std::string layers_text(int n) { return n == 1 ? std::string("layer") : cat(n, " layers"); }

}  // namespace

std::string TrainingMemoryPlan::to_text() const {
  std::string sites;
  for (UpdateSite site :
       {UpdateSite::kHost, UpdateSite::kDeviceResident, UpdateSite::kDeviceStaged}) {
    if (offload.count(site) == 0) continue;
    sites += cat(sites.empty() ? "" : ", ", offload.count(site), " ", update_site_name(site));
  }
  std::string text = cat("schedule: ", update_schedule_name(offload.settings.schedule), " (",
                         offload.subgroups.size(), " subgroups of up to ",
                         offload.max_subgroup_size, " parameters: ", sites);
  if (offload.count(UpdateSite::kDeviceStaged) > 0)
    text += cat("; stride ", offload.settings.stride, ", ", offload.settings.staging_buffers,
                " staging buffers");
  text += cat(")\n", "parameters: ", num_params, "\n");
  if (world_size > 1 || zero_stage > 0)
    text += cat("ZeRO stage ", zero_stage, " over ", world_size, " ranks: this rank updates ",
                offload.partition.size(), " parameters [", offload.partition.begin, ", ",
                offload.partition.end, "); model states ", format_bytes(model_state_bytes()),
                " (working params + gradients ", format_bytes(model_bytes), ", ", state_names, " ",
                format_bytes(offload.partition.size() * state_bytes_per_param), ")",
                zero_buffer_bytes > 0
                    ? cat("; buffers ", format_bytes(zero_buffer_bytes),
                          zero_stage == 3 ? " (gradient slots, gathered and persistent parameters)"
                                          : " (gradient slots and micro-batch partials)")
                    : std::string(),
                "\n");
  text +=
      cat("memory per tier", world_size > 1 ? " (per rank)" : "", ":\n",
          "  device:      ", format_bytes(total.device), " of ", format_bytes(device_capacity),
          " (activations ", format_bytes(activation_bytes),
          recompute_interval > 0 ? cat(" recomputing every ", layers_text(recompute_interval), ", ",
                                       format_bytes(activation_bytes_without_recompute), " without")
                                 : std::string(),
          ", working params + gradients ", format_bytes(model_bytes + zero_buffer_bytes),
          model_elem_bytes == 2 ? " in bf16" : " in fp32", ", optimizer state + staging ",
          format_bytes(optimizer_device_bytes), ")", fits() ? "" : "  << does not fit", "\n",
          "  pinned host: ", format_bytes(total.pinned_host), " (offloaded ", state_names,
          "; host gradients and working copies",
          activation_host_bytes > 0 ? cat("; the kept layer outputs (cpu_checkpointing), ",
                                          format_bytes(activation_host_bytes))
                                    : std::string(),
          snapshot.streamed ? "; the checkpoint snapshot's pool"
          : pinned_snapshot ? "; the lazy checkpoint's snapshot"
                            : "",
          ")\n", "  host:        ", format_bytes(total.host),
          snapshot.streamed ? " (no copy of the state for checkpoints: see below)"
                            : " (the checkpoint snapshot: lazy checkpoints keep it for the "
                              "run; a synchronous save of several ranks takes the fp32 "
                              "params' part of it to gather them, of one rank none)",
          "\n");
  if (machine_host_bytes > 0)
    text +=
        cat("  machine:     ", format_bytes(machine_host_bytes), " of host memory; the plan takes ",
            format_bytes(host_bytes_needed()), device_is_host ? " (the cpu device's included)" : "",
            host_fits() ? "" : cat("  << does not fit: ", host_memory_fixes()), "\n");
  if (snapshot.streamed)
    text += cat("checkpoint snapshot: streamed through a pool of ", snapshot.pool_slots, " x ",
                format_bytes(snapshot.pool_slot_floats * sizeof(float)),
                " pinned slots: a full copy of the state (", format_bytes(snapshot.full_bytes),
                ") does not fit the ", format_bytes(snapshot.budget), " it may take (",
                "train.checkpoint_memory_mb, 0: what the machine has left); a slow disk may stall "
                "the update after a checkpoint\n");
  if (rates.cpu_params_per_s == 0)
    return text + (fits() ? "measured: nothing (the performance model times AdamW only; `tandem "
                            "bench demo` measures DeMo's step)\n"
                          : "measured: nothing (the plan does not fit)\n");
  if (gpu_assumed)
    return text +
           cat(gpu_assumed->cpu_params_per_s == 0 ? "measured: " : "assumed: ", "CPU update ",
               rates.cpu_params_per_s / 1e9, " G params/s",
               gpu_assumed->cpu_params_per_s == 0 ? " on this machine" : "",
               "; assumed (no GPU here): ", gpu_assumed->to_text(), "\n", prediction.to_text(),
               "\n");
  return text + cat("measured: ", rates.to_text(), "\n", prediction.to_text(), "\n");
}

AssumedGpu AssumedGpu::for_optimizer(const OptimizerFamily& family) const {
  AssumedGpu gpu = *this;
  gpu.update_bytes_per_param = family.gpu_bytes_per_param;
  gpu.update_params_per_s =
      family.gpu_bytes_per_param > 0
          ? update_bytes_per_s / static_cast<double>(family.gpu_bytes_per_param)
          : 0;
  return gpu;
}

std::string TrainingMemoryPlan::host_memory_fixes() const {
  return cat("offload less optimizer state, ",
             snapshot.automatic ? "" : "lower train.checkpoint_memory_mb, ",
             "lower the micro-batch or the sequence length, or use a machine with more memory");
}

std::string AssumedGpu::to_text() const {
  return cat(name, ", device update ", update_params_per_s / 1e9, " G params/s, host-to-device ",
             h2d_bytes_per_s / 1e9, " GB/s, device-to-host ", d2h_bytes_per_s / 1e9, " GB/s (",
             memory_source, " for ", update_bytes_per_param, " bytes/param; ", link_source, ")");
}

int fewest_ranks_at_zero_stage_3(const TrainConfig& config, DeviceKind kind, size_t capacity,
                                 int max_ranks) {
  // Only an optimizer whose gradients are reduced may run at stage 3.
  if (!optimizer_family(config.optimizer.type).reduces_gradients) return 0;
  TrainConfig sharded = config;
  sharded.zero.stage = 3;
  const auto fits_on = [&](int ranks) {
    return plan_memory(sharded, kind, capacity, zero_state_range(sharded, ranks, 0), ranks).fits();
  };
  // Rank 0 holds the most, and what a rank holds shrinks as ranks are added: double until it
  // fits, then walk up from the last count that did not.
  int below = 1, ranks = 2;
  while (!fits_on(ranks)) {
    if (ranks >= max_ranks) return 0;
    below = ranks;
    ranks = std::min(2 * ranks, max_ranks);
  }
  for (int r = below + 1; r < ranks; r++)
    if (fits_on(r)) return r;
  return ranks;
}

int largest_micro_batch(const TrainingMemoryPlan& plan, const TrainConfig& config,
                        int recompute_interval) {
  const bool auto_offloads = plan.offload.settings.schedule == UpdateSchedule::kAuto;
  const size_t rest = plan.model_bytes + plan.zero_buffer_bytes +
                      (auto_offloads ? plan.rule_workspace_bytes : plan.optimizer_device_bytes);
  if (rest >= plan.device_capacity) return 0;
  const size_t budget = plan.device_capacity - rest;
  const auto fits = [&](int B) {
    return model_activation_bytes(
               config.model, B, config.seq_len(), config.storage_dtype(), recompute_interval,
               config.activation_checkpointing.cpu_checkpointing && recompute_interval > 0) <=
           budget;
  };
  // Activations grow with B: double past the answer, then bisect.
  constexpr int kMost = 1 << 24;
  if (!fits(1)) return 0;
  int fitting = 1, too_big = 2;
  while (too_big < kMost && fits(too_big)) {
    fitting = too_big;
    too_big *= 2;
  }
  if (too_big >= kMost && fits(kMost)) return kMost;
  while (too_big - fitting > 1) {
    const int mid = fitting + (too_big - fitting) / 2;
    (fits(mid) ? fitting : too_big) = mid;
  }
  return fitting;
}

std::string largest_micro_batch_text(const TrainingMemoryPlan& plan, const TrainConfig& config) {
  const int interval = config.activation_checkpointing.interval;
  std::string text =
      cat("largest micro-batch that fits: ", largest_micro_batch(plan, config, interval));
  if (interval != 1)
    text += cat(" (", largest_micro_batch(plan, config, 1),
                " recomputing every layer: activation_checkpointing.interval=1)");
  return text;
}

void check_snapshot_pool(const CheckpointSnapshotPlan& snapshot) {
  TANDEM_CHECK(!snapshot.streamed || (snapshot.budget >= CheckpointSnapshotPlan::kMinPoolBytes &&
                                      snapshot.pool_slot_floats > 0),
               "a full copy of the state for checkpoints (", format_bytes(snapshot.full_bytes),
               ") does not fit the ", format_bytes(snapshot.budget),
               " it may take, and a pool to stream it through needs at least ",
               format_bytes(CheckpointSnapshotPlan::kMinPoolBytes),
               "; raise train.checkpoint_memory_mb");
}

void check_fits(const TrainingMemoryPlan& plan, const TrainConfig& config) {
  check_snapshot_pool(plan.snapshot);
  if (plan.fits()) return;
  const int ranks = fewest_ranks_at_zero_stage_3(
      config, plan.device_is_host ? DeviceKind::kHostOnly : DeviceKind::kCuda,
      plan.device_capacity);
  const std::string shard = ranks > plan.world_size
                                ? cat(", or shard the model over ", ranks,
                                      " ranks at ZeRO stage 3 (the fewest whose "
                                      "rank 0 fits: `tandem plan ",
                                      config.source_arguments(), " --world-size ", ranks,
                                      " --set zero_optimization.stage=3` shows it)")
                                : std::string();
  throw DeviceOutOfMemory(
      cat("device memory too small: the '", update_schedule_name(plan.offload.settings.schedule),
          "' schedule needs ", format_bytes(plan.total.device), " on the device (activations ",
          format_bytes(plan.activation_bytes), ", working params + gradients ",
          format_bytes(plan.model_bytes + plan.zero_buffer_bytes), ", optimizer state + staging ",
          format_bytes(plan.optimizer_device_bytes), ") and ", format_bytes(plan.total.pinned_host),
          " of pinned host memory, but device.memory_gb = ", config.device.memory_gb,
          "; raise device.memory_gb, ",
          plan.offload.settings.schedule == UpdateSchedule::kCpu
              ? std::string()  // every update already on the CPU: no state left to offload
              : std::string("offload more optimizer state (offload_optimizer.schedule cpu, "
                            "interleave or auto, or a lower offload_optimizer.ratio), "),
          "lower train_micro_batch_size_per_gpu / train.seq_len (activations; ",
          largest_micro_batch_text(plan, config), ")", shard));
}

}  // namespace tandem
