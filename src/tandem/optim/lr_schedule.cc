#include "tandem/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tandem {

float WarmupCosineSchedule::lr_at(int64_t step) const {
  if (step < warmup_steps)
    return static_cast<float>(static_cast<double>(base_lr) * (step + 1) / warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / decay_steps);
  const double min_lr = static_cast<double>(base_lr) * min_ratio;
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(min_lr + coeff * (base_lr - min_lr));
}

}  // namespace tandem
