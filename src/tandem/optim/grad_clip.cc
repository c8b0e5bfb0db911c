#include "tandem/optim/grad_clip.h"

#include <cmath>

namespace tandem {

double global_grad_norm(ThreadPool& pool, const float* grads, size_t n) {
  return std::sqrt(sum_of_squares(pool, grads, n));
}

float clip_scale(double norm, float max_norm) {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace tandem
