// What a training run needs where, decided before it starts: the optimizer update
// plan (fixed or `auto`), the bytes in each memory tier, the measured rates and the
// predicted update time. `tandem plan` prints it; the trainer refuses to start when
// the device is too small, naming the bytes per tier and the settings to change.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/perf_model.h"
#include "tandem/train/train_config.h"

namespace tandem {

struct TrainingMemoryPlan {
  OffloadPlan offload;
  size_t num_params = 0;
  size_t device_capacity = 0;
  size_t activation_bytes = 0;        // device: activations and backward scratch
  size_t model_elem_bytes = 4;        // bytes per working param and gradient (fp32 or bf16)
  size_t model_bytes = 0;             // device: working params + gradients
  size_t optimizer_device_bytes = 0;  // device: resident fp32 state + staging buffers
  TierBytes total;                    // every tier, all of the above included
  UpdateRates rates;
  UpdatePrediction prediction;

  bool fits() const { return total.device <= device_capacity; }
  std::string to_text() const;
};

// The device the update engine uses for `config` (device.type, device.memory_gb).
// `model_bytes`: device memory the model already holds outside the device's own
// accounting (a GPU compute backend allocates it first); the device gets what is left
// of device.memory_gb.
std::unique_ptr<Device> make_training_device(const TrainConfig& config, size_t model_bytes = 0);

// Calibrates the update rates on `device` and `pool`, builds the update plan (the
// performance model's choice for `auto`) and adds up the memory. `model_allocated`:
// device bytes the model already holds outside the device's own accounting (a GPU
// compute backend allocates them before the device measures what is free); they count
// as part of the capacity. 0 when the model's memory is to be reserved in the device.
TrainingMemoryPlan plan_training(const TrainConfig& config, Device& device, ThreadPool& pool,
                                 size_t model_allocated = 0);

// Throws tandem::Error when the plan does not fit in device memory, with the bytes
// per tier and what to change.
void check_fits(const TrainingMemoryPlan& plan, const TrainConfig& config);

}  // namespace tandem
