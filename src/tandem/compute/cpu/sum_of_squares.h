// The sum of squares of a host array, in an order fixed by the data alone: what gradient
// clipping's global norm is made of (optim/grad_clip.h), and what every backend's and
// every ZeRO partition's block sums must reproduce bit for bit.
#pragma once

#include <cstddef>

namespace tandem {

class ThreadPool;

// Sum of squares of n floats (host memory), accumulated in double in fixed-size blocks
// summed in order: the same bits for any thread count, which the update schedules rely
// on (every schedule must clip by the same factor).
double sum_of_squares(ThreadPool& pool, const float* x, size_t n);
// The same in two parts, so that a buffer cut into pieces of whole blocks (ZeRO
// partitions) gives the same bits: partial[k] = the sum of squares of block k, the
// elements [k B, (k + 1) B) with B = kSumOfSquaresBlock (the last block may be short);
// sum_of_squares = sum_in_order(the partials of all blocks).
constexpr size_t kSumOfSquaresBlock = size_t{1} << 14;
void sum_of_squares_blocks(ThreadPool& pool, const float* x, size_t n, double* partial);
double sum_in_order(const double* partial, size_t count);

}  // namespace tandem
