#include "tandem/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tandem {

double WarmupCosineSchedule::lr_at(int64_t step) const {
  if (step < warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / decay_steps);
  const double min_lr = base_lr * min_ratio;
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return min_lr + coeff * (base_lr - min_lr);
}

}  // namespace tandem
