// Learning-rate schedule: linear warm-up, then cosine decay to a floor (DeepSpeed's
// WarmupCosineLR vocabulary: warmup_num_steps, cos_min_ratio).
#pragma once

#include <cstdint>

namespace tandem {

struct WarmupCosineSchedule {
  double base_lr = 1e-3;  // as the config gives it: the rules round what they derive once
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_ratio = 0.1;  // the floor is base_lr * min_ratio

  // step is 0-based: step 0 of warm-up uses base_lr / warmup_steps, the last warm-up
  // step base_lr; afterwards cosine from base_lr down to the floor at total_steps.
  double lr_at(int64_t step) const;
};

}  // namespace tandem
