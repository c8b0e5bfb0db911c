#include "tandem/optim/grad_clip.h"

#include <cmath>
#include <vector>

namespace tandem {

double global_grad_norm(const float* grads, size_t n) {
  return std::sqrt(sum_of_squares(grads, n));
}

double sum_of_squares(const float* grads, size_t n) {
  constexpr size_t kBlock = 1 << 14;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t blk = 0; blk < blocks; blk++) {
    const size_t begin = blk * kBlock;
    const size_t end = begin + kBlock < n ? begin + kBlock : n;
    double sum = 0.0;
    for (size_t i = begin; i < end; i++) sum += static_cast<double>(grads[i]) * grads[i];
    partial[blk] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

float clip_scale(double norm, float max_norm) {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace tandem
