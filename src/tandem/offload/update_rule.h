// What an optimizer is to the update engine (update_engine.h): an update rule. The engine
// owns placement (which subgroup is updated where), memory, copies and their overlap; a
// rule owns the arithmetic: the fp32 arrays it keeps per parameter, its per-step scalars,
// its CPU kernel for subgroups in host memory and its device kernel for subgroups in
// device memory. Both kernels must compute the same IEEE operations in the same order, so
// that every offload schedule gives the same bits.
//
// A rule may need every rank before it can update (DeMo: optim/demo/demo_rule.h): then each
// step the engine runs its prepare kernels on every subgroup at its site, calls exchange()
// once every subgroup is prepared, and then runs its update kernels on every subgroup.
//
// Rules: AdamW (optim/adamw/adamw_rule.h), DeMo (optim/demo/demo_rule.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/device/device.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/offload/update_types.h"

namespace tandem {

// One subgroup's arrays as a rule sees them.
struct RuleArrays {
  // state_floats() arrays of `size` floats one after another: the fp32 master weights
  // first, then the rule's own (AdamW: m, v).
  float* state = nullptr;
  size_t size = 0;
  size_t begin = 0;             // the flat index of element 0 (which tensors the subgroup holds)
  const void* grads = nullptr;  // [size] of grad_dtype
  GradDType grad_dtype = GradDType::kF32;
  // A 16-bit working copy written in the same pass (mixed precision), or null.
  void* params16 = nullptr;
  WorkingDType params16_dtype = WorkingDType::kNone;

  float* array(size_t k) const { return state + k * size; }
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  virtual std::string_view name() const = 0;
  // The names of a parameter's fp32 state arrays, the master weights first ("param",
  // "exp_avg", "exp_avg_sq"): what a checkpoint stores.
  virtual const std::vector<std::string>& state_arrays() const = 0;
  size_t state_floats() const { return state_arrays().size(); }

  // Before a step's updates: its number (1-based), learning rate and gradient scale. lr
  // is the schedule's double: a rule rounds each factor it derives from lr to float once
  // (DeMo's 1 - lr * weight_decay, as the reference computes it).
  virtual void begin_step(int64_t step, double lr, float grad_scale) = 0;
  // A subgroup in host memory, updated now on the CPU.
  virtual void update_on_host(const RuleArrays& arrays,
                              std::span<const UpdateSegment> segments) = 0;
  // A subgroup in device memory: the kernel the engine queues on a device stream.
  virtual DeviceKernel device_update(const RuleArrays& arrays,
                                     std::span<const UpdateSegment> segments) const = 0;

  // Called once by the engine before any step, with the device its device kernels run on
  // and the plan: a rule whose device kernels need memory of their own (DeMo's on a GPU:
  // DCT matrices, scratch, messages) allocates it here, and throws DeviceOutOfMemory when
  // it does not fit.
  virtual void attach_device(Device& /*device*/, const OffloadPlan& /*plan*/) {}

  // The collective phase (see above); a rule without one keeps these defaults.
  virtual bool has_exchange() const { return false; }
  virtual void prepare_on_host(const RuleArrays& /*arrays*/) {}
  virtual DeviceKernel device_prepare(const RuleArrays& /*arrays*/) const { return {}; }
  // Every subgroup of the step is prepared (device kernels included): exchange with the
  // other ranks. A collective.
  virtual void exchange() {}
};

}  // namespace tandem
