// Global-norm gradient clipping.
#pragma once

#include <cstddef>

namespace tandem {

// Sum of squares of n floats (host memory), accumulated in double in fixed-size blocks
// summed in order: the same bits for any thread count, which the update schedules rely
// on (every schedule must clip by the same factor).
double sum_of_squares(const float* x, size_t n);
// The same in two parts, so that a buffer cut into pieces of whole blocks (ZeRO
// partitions) gives the same bits: partial[k] = the sum of squares of block k, the
// elements [k B, (k + 1) B) with B = kSumOfSquaresBlock (the last block may be short);
// sum_of_squares = sum_in_order(the partials of all blocks).
constexpr size_t kSumOfSquaresBlock = size_t{1} << 14;
void sum_of_squares_blocks(const float* x, size_t n, double* partial);
double sum_in_order(const double* partial, size_t count);

// sqrt(sum_of_squares(grads, n)).
double global_grad_norm(const float* grads, size_t n);

// The factor to multiply gradients by: max_norm / (norm + 1e-6) when norm exceeds
// max_norm, else 1 (as torch.nn.utils.clip_grad_norm_). max_norm <= 0 disables.
float clip_scale(double norm, float max_norm);

}  // namespace tandem
