// Global-norm gradient clipping.
#pragma once

#include <cstddef>

#include "tandem/compute/cpu/sum_of_squares.h"

namespace tandem {

// sqrt(sum_of_squares(grads, n)): the same bits for any thread count.
double global_grad_norm(ThreadPool& pool, const float* grads, size_t n);

// The factor to multiply gradients by: max_norm / (norm + 1e-6) when norm exceeds
// max_norm, else 1 (as torch.nn.utils.clip_grad_norm_). max_norm <= 0 disables.
float clip_scale(double norm, float max_norm);

}  // namespace tandem
