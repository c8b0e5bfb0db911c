#include "tandem/compute/cpu/sum_of_squares.h"

#include <vector>

namespace tandem {

double sum_of_squares(const float* x, size_t n) {
  std::vector<double> partial((n + kSumOfSquaresBlock - 1) / kSumOfSquaresBlock);
  sum_of_squares_blocks(x, n, partial.data());
  return sum_in_order(partial.data(), partial.size());
}

void sum_of_squares_blocks(const float* x, size_t n, double* partial) {
  constexpr size_t kBlock = kSumOfSquaresBlock;
  const size_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (size_t blk = 0; blk < blocks; blk++) {
    const size_t begin = blk * kBlock;
    const size_t end = begin + kBlock < n ? begin + kBlock : n;
    double sum = 0.0;
    for (size_t i = begin; i < end; i++) sum += static_cast<double>(x[i]) * x[i];
    partial[blk] = sum;
  }
}

double sum_in_order(const double* partial, size_t count) {
  double total = 0.0;
  for (size_t i = 0; i < count; i++) total += partial[i];
  return total;
}

}  // namespace tandem
