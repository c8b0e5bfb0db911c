// AdamW as the update engine's rule (offload/update_rule.h): state [param | m | v], the
// step's scalars from adamw_step_scalars, CpuAdamW on the host and adamw_device_kernel on a
// device, both adamw_reference's operations.
#pragma once

#include <iterator>
#include <string>
#include <vector>

#include "tandem/core/cpu_features.h"
#include "tandem/core/thread_pool.h"
#include "tandem/offload/update_rule.h"
#include "tandem/optim/adamw/adamw_reference.h"
#include "tandem/optim/adamw/cpu_adamw.h"

namespace tandem {

// AdamW's own settings in a config (optim/optimizer_family.h, OptimizerConfig::own): its
// optimizer.params beyond lr and weight_decay.
struct AdamWSettings {
  float beta1 = 0.9f;  // "betas": [beta1, beta2]
  float beta2 = 0.95f;
  float eps = 1e-8f;
};

class AdamWRule final : public UpdateRule {
 public:
  // hyper.lr is not used: each step's learning rate comes with begin_step.
  AdamWRule(const AdamWHyper& hyper, ThreadPool& pool, SimdTarget target = best_simd_target());

  // The state arrays, the fp32 params first (a checkpoint's names; optim/optimizer_family.h).
  static constexpr std::string_view kStateArrays[] = {"param", "exp_avg", "exp_avg_sq"};

  std::string_view name() const override { return "adamw"; }
  const std::vector<std::string>& state_arrays() const override { return arrays_; }
  void begin_step(int64_t step, double lr, float grad_scale) override;
  void update_on_host(const RuleArrays& arrays, std::span<const UpdateSegment> segments) override;
  DeviceKernel device_update(const RuleArrays& arrays,
                             std::span<const UpdateSegment> segments) const override;

 private:
  AdamWArrays adamw_arrays(const RuleArrays& arrays) const;

  AdamWHyper hyper_;
  CpuAdamW cpu_;
  SimdTarget target_;
  std::vector<std::string> arrays_{std::begin(kStateArrays), std::end(kStateArrays)};
  AdamWStepScalars with_decay_{}, without_decay_{};
};

}  // namespace tandem
