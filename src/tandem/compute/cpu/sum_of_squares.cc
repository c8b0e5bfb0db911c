#include "tandem/compute/cpu/sum_of_squares.h"

#include <vector>

#include "tandem/core/thread_pool.h"

namespace tandem {

double sum_of_squares(ThreadPool& pool, const float* x, size_t n) {
  std::vector<double> partial((n + kSumOfSquaresBlock - 1) / kSumOfSquaresBlock);
  sum_of_squares_blocks(pool, x, n, partial.data());
  return sum_in_order(partial.data(), partial.size());
}

void sum_of_squares_blocks(ThreadPool& pool, const float* x, size_t n, double* partial) {
  constexpr size_t kBlock = kSumOfSquaresBlock;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  pool.parallel_for(blocks, 1, [&](size_t first, size_t last) {
    for (size_t blk = first; blk < last; blk++) {
      const size_t begin = blk * kBlock;
      const size_t end = begin + kBlock < n ? begin + kBlock : n;
      double sum = 0.0;
      for (size_t i = begin; i < end; i++) sum += static_cast<double>(x[i]) * x[i];
      partial[blk] = sum;
    }
  });
}

double sum_in_order(const double* partial, size_t count) {
  double total = 0.0;
  for (size_t i = 0; i < count; i++) total += partial[i];
  return total;
}

}  // namespace tandem
