// Learning-rate schedule: linear warm-up, then cosine decay to a floor (DeepSpeed's
// WarmupCosineLR vocabulary: warmup_num_steps, cos_min_ratio).
#pragma once

#include <cstdint>

namespace tandem {

struct WarmupCosineSchedule {
  float base_lr = 1e-3f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  float min_ratio = 0.1f;  // the floor is base_lr * min_ratio

  // step is 0-based: step 0 of warm-up uses base_lr / warmup_steps, the last warm-up
  // step base_lr; afterwards cosine from base_lr down to the floor at total_steps.
  float lr_at(int64_t step) const;
};

}  // namespace tandem
