#include "tandem/optim/adamw_rule.h"

#include "tandem/core/error.h"
#include "tandem/optim/adamw_device_kernel.h"

namespace tandem {

AdamWRule::AdamWRule(const AdamWHyper& hyper, ThreadPool& pool, SimdTarget target)
    : hyper_(hyper), cpu_(pool, target), target_(target) {}

void AdamWRule::begin_step(int64_t step, double lr, float grad_scale) {
  TANDEM_CHECK(step >= 1, "AdamW: step ", step, " (steps count from 1)");
  AdamWHyper hyper = hyper_;
  hyper.lr = static_cast<float>(lr);  // AdamW's scalars come from its float hyper-parameters
  with_decay_ = adamw_step_scalars(hyper, step, true, grad_scale);
  without_decay_ = adamw_step_scalars(hyper, step, false, grad_scale);
}

AdamWArrays AdamWRule::adamw_arrays(const RuleArrays& arrays) const {
  AdamWArrays a;
  a.params = arrays.array(0);
  a.m = arrays.array(1);
  a.v = arrays.array(2);
  a.grads = arrays.grads;
  a.grad_dtype = arrays.grad_dtype;
  a.params16 = arrays.params16;
  a.params16_dtype = arrays.params16 != nullptr ? arrays.params16_dtype : WorkingDType::kNone;
  return a;
}

void AdamWRule::update_on_host(const RuleArrays& arrays, std::span<const UpdateSegment> segments) {
  cpu_.update(adamw_arrays(arrays), segments, with_decay_, without_decay_);
}

DeviceKernel AdamWRule::device_update(const RuleArrays& arrays,
                                      std::span<const UpdateSegment> segments) const {
  return adamw_device_kernel(adamw_arrays(arrays), segments, with_decay_, without_decay_, target_);
}

}  // namespace tandem
