// What a training run needs where, decided before it starts: the optimizer update
// plan (fixed or `auto`), the bytes in each memory tier, the measured rates and the
// predicted update time. `tandem plan` prints it; the trainer refuses to start when
// the device is too small, naming the bytes per tier and the settings to change.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "tandem/comm/communicator.h"
#include "tandem/config/train_config.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/perf_model.h"

namespace tandem {

// How a run's checkpoints capture the optimizer state (ckpt/checkpointer.h): a full copy
// (on a GPU two, the pinned capture target and the host copy the writer reads) when it fits
// in the host memory a snapshot may take (train.checkpoint_memory_mb, else what the
// machine has left after the plan's other tiers); else a bounded pool of pinned slots the
// snapshot streams through (offload/snapshot_pool.h), whose wait for the disk may then
// stall the next update (back-pressure), and which synchronous saves use too.
struct CheckpointSnapshotPlan {
  static constexpr size_t kPoolSlots = 4;
  static constexpr size_t kDefaultPoolBytes = size_t{256} << 20;  // the pool `auto` takes
  static constexpr size_t kMinPoolBytes = size_t{64} << 10;
  bool streamed = false;
  // train.checkpoint_memory_mb was 0: the budget is what the machine has left, so lowering
  // the setting would take nothing off the plan.
  bool automatic = false;
  size_t budget = 0;      // host bytes it may take
  size_t full_bytes = 0;  // what full copies take
  size_t pool_slots = 0, pool_slot_floats = 0;

  size_t pool_bytes() const { return pool_slots * pool_slot_floats * sizeof(float); }
  // The host bytes it takes, and how many of them are pinned.
  size_t bytes() const { return streamed ? pool_bytes() : full_bytes; }
};

// The GPU a plan is made for where none is at hand (planning a run for a GPU machine
// from a laptop or CI): its rates are assumed, not measured. The defaults are an H100's:
// an optimizer's device update streams the bytes per parameter its row names
// (optim/optimizer_family.h, gpu_bytes_per_param: AdamW 28, its fp32 params, m, v read and
// written, bf16 gradient read, bf16 working copy written) at 70% of its 3.35 TB/s, and PCIe
// moves 19 GB/s each way during the update (Deep Optimizer States' measurement on H100).
struct AssumedGpu {
  std::string name = "H100";
  double update_bytes_per_s = 0.7 * 3.35e12;  // the memory bandwidth a device update reaches
  double h2d_bytes_per_s = 19e9;
  double d2h_bytes_per_s = 19e9;
  // Model FLOPs per second of forward and backward (step_plan.h's assumed compute): what
  // tandem's Llama 3B trained at on an H100 (2026-11-26: 23,838 tokens/s x 6 x 3.02 B is
  // 432 TFLOPS), rounded down.
  double model_flops_per_s = 400e12;
  // The CPU update rate of the GPU machine; 0: this machine's, measured (the planner's
  // best guess; a plan made on the GPU machine itself measures everything).
  double cpu_params_per_s = 0;
  std::string memory_source = "HBM 3.35 TB/s at 70%";
  std::string link_source = "PCIe as Deep Optimizer States measured on H100";
  // A rank's share of a collective between the GPUs of one machine (comm/comm_rate.h):
  // NCCL point-to-point over NVLink, below its 450 GB/s a direction since tandem sums the
  // pieces with its own fixed-order kernels (nccl_communicator.h).
  double peer_bytes_per_s = 100e9;
  std::string peer_source = "assumed: NVLink between the GPUs of one machine";
  // For one optimizer (for_optimizer): the bytes per parameter its device update streams,
  // and so its update rate; 0 until then.
  size_t update_bytes_per_param = 0;
  double update_params_per_s = 0;
  // This GPU updating with `family`'s kernels (its row's gpu_bytes_per_param).
  AssumedGpu for_optimizer(const OptimizerFamily& family) const;
  std::string to_text() const;
};

struct TrainingMemoryPlan {
  OffloadPlan offload;
  size_t num_params = 0;
  size_t device_capacity = 0;
  size_t activation_bytes = 0;  // device: activations and backward scratch
  // activation_checkpointing.interval, and the activations without recompute (what the
  // text shows beside them when it is on).
  int recompute_interval = 0;
  size_t activation_bytes_without_recompute = 0;
  // activation_checkpointing.cpu_checkpointing: the kept outputs in pinned host memory.
  size_t activation_host_bytes = 0;
  size_t model_elem_bytes = 4;  // bytes per working param and gradient (fp32 or bf16)
  size_t model_bytes = 0;       // device: working params + gradients this rank holds
  // device, ZeRO stages 2 and 3: gradient slots, micro-batch partials, persistent and
  // gathered parameters (buffers, not model states).
  size_t zero_buffer_bytes = 0;
  // device: resident fp32 state + staging buffers + the rule's workspace
  size_t optimizer_device_bytes = 0;
  // device: what the rule's own GPU kernels need (DeMo: DCT matrices, scratch, messages)
  size_t rule_workspace_bytes = 0;
  // The update rule's fp32 state per parameter (AdamW: params, m, v = 12; DeMo: params,
  // delta = 8) and its names for the text.
  size_t state_bytes_per_param = 12;
  // Lazy checkpoints on a GPU capture their full snapshot into pinned memory (a second
  // copy of the state, beside the host one the writer reads).
  bool pinned_snapshot = false;
  CheckpointSnapshotPlan snapshot;
  std::string state_names = "fp32 params, m, v";
  TierBytes total;  // every tier, all of the above included
  UpdateRates rates;
  UpdatePrediction prediction;
  // Set when the plan is for a GPU that is not here (plan_training_without_gpu): the
  // device's rates are these assumptions; the CPU's are measured.
  std::optional<AssumedGpu> gpu_assumed;
  // Data parallelism: the ranks and the ZeRO stage; offload.partition is this rank's.
  int world_size = 1;
  int zero_stage = 0;

  // What ZeRO's paper counts as model states, per rank: working params, gradients and
  // the fp32 optimizer state this rank holds (AdamW's numbers: (in mixed precision: 16P at stage 0,
  // 4P + 12P/N at stage 1, 2P + 14P/N at stage 2, 16P/N at stage 3, up to the padding).
  size_t model_state_bytes() const;

  bool fits() const { return total.device <= device_capacity; }
  // The machine's memory (host_memory_bytes; 0: unknown) and what the plan takes of it:
  // the host tiers, and the device's on the cpu device, whose "device" is host memory.
  size_t machine_host_bytes = 0;
  bool device_is_host = false;
  size_t host_bytes_needed() const {
    return total.host + total.pinned_host + (device_is_host ? total.device : 0);
  }
  // What to lower for the host memory: the snapshot's budget only when the config set it.
  std::string host_memory_fixes() const;
  bool host_fits() const {
    return machine_host_bytes == 0 || host_bytes_needed() <= machine_host_bytes;
  }
  std::string to_text() const;
};

// The device a run of `config` trains on (device.type, with device.memory_gb as the
// capacity of its memory): the model's tensors and the optimizer state share it. `injected`:
// the cpu device's fault and slowness injection, for tests (its memory_bytes is ignored).
std::unique_ptr<Device> make_training_device(const TrainConfig& config, int cuda_device_index = 0,
                                             const CpuDeviceOptions& injected = {});

// Calibrates the update rates on `device` and `pool` (AdamW; DeMo's are measured by
// `tandem bench demo`, and its plans are not costed), builds the update plan (the
// performance model's choice for `auto`; DeMo's subgroups cut at tensor ends) and adds up
// the memory, the model's included.
// Call it before the model allocates anything on the device.
TrainingMemoryPlan plan_training(const TrainConfig& config, Device& device, ThreadPool& pool);
// The same for a rank that holds the optimizer state of `state_range` only (ZeRO).
// `peers`: the ranks planning at this moment on the same machine (every one calls it), which
// time the update together, so that the rates are those of ranks sharing the host's cores and
// memory bandwidth (each the slowest rank's, the same on every rank).
TrainingMemoryPlan plan_training(const TrainConfig& config, Device& device, ThreadPool& pool,
                                 ParamRange state_range, int world_size = 1,
                                 Communicator* peers = nullptr);
// plan_training's two halves, for a planner that plans many configs at one set of rates
// (step_plan.h): the rates measured on `device` for `config` (none: the optimizer is not
// timed, or the plan does not fit), and the plan at given rates (none: a fixed plan, no
// prediction).
std::optional<UpdateRates> measure_update_rates(const TrainConfig& config, Device& device,
                                                ThreadPool& pool, ParamRange state_range,
                                                int world_size = 1, Communicator* peers = nullptr);
TrainingMemoryPlan plan_training_at_rates(const TrainConfig& config, DeviceKind kind,
                                          size_t capacity, ParamRange state_range, int world_size,
                                          const std::optional<UpdateRates>& rates);
// The same two for a GPU that is not here: the CPU's rate measured on this machine (or
// gpu.cpu_params_per_s), the GPU's `gpu`'s.
std::optional<UpdateRates> assumed_gpu_update_rates(const TrainConfig& config, ThreadPool& pool,
                                                    ParamRange state_range, int world_size,
                                                    const AssumedGpu& gpu = {});
TrainingMemoryPlan plan_training_on_assumed_gpu(const TrainConfig& config,
                                                const std::optional<UpdateRates>& rates,
                                                ParamRange state_range, int world_size,
                                                const AssumedGpu& gpu = {});
// The same for a cuda device of device.memory_gb that this machine does not have: the memory
// is planned as on the GPU, the CPU update rate measured here, the GPU's rates `gpu`.
TrainingMemoryPlan plan_training_without_gpu(const TrainConfig& config, ThreadPool& pool,
                                             ParamRange state_range, int world_size = 1,
                                             const AssumedGpu& gpu = {});
// The parameters whose optimizer state rank `rank` of `world_size` holds at the config's
// ZeRO stage: all at stage 0, its partition from stage 1 (zero/partition.h).
ParamRange zero_state_range(const TrainConfig& config, int world_size, int rank);

// The largest train_micro_batch_size_per_gpu whose activations (at the config's seq_len,
// recomputing every `recompute_interval` layers; 0: none) fit the device beside the rest of
// `plan`, the `auto` schedule's optimizer state counted as none (it offloads what does not
// fit); 0 when not even one sequence does.
int largest_micro_batch(const TrainingMemoryPlan& plan, const TrainConfig& config,
                        int recompute_interval);
// "largest micro-batch that fits: 3 (12 recomputing every layer: ...)": recompute's beside
// the config's own when the config does not recompute every layer.
std::string largest_micro_batch_text(const TrainingMemoryPlan& plan, const TrainConfig& config);

// The fewest ranks over which ZeRO stage 3 fits `config` on devices of `kind` and `capacity`
// bytes each (rank 0's memory, the most of any rank), or 0 when none up to `max_ranks` does
// (the activations alone too big, say) or the optimizer cannot be sharded.
int fewest_ranks_at_zero_stage_3(const TrainConfig& config, DeviceKind kind, size_t capacity,
                                 int max_ranks = 4096);

// Throws DeviceOutOfMemory when the plan does not fit in device memory, with the bytes
// per tier and what to change (the fewest ranks at ZeRO stage 3 among them), or
// tandem::Error when its checkpoint snapshot cannot be taken (check_snapshot_pool).
void check_fits(const TrainingMemoryPlan& plan, const TrainConfig& config);
// Throws when a streamed snapshot's pool would be below CheckpointSnapshotPlan::kMinPoolBytes.
void check_snapshot_pool(const CheckpointSnapshotPlan& snapshot);

}  // namespace tandem
