// One check of StorageKernels::sum_of_squares_blocks, run on every backend (the CPU backend in
// test_data_parallel, the CUDA one in test_cuda_backend, emulated in CI): the block sums in
// order are sum_of_squares to the bit, and a piece starting on a block boundary (a ZeRO
// partition) gets the whole buffer's block sums to the bit.
#pragma once

#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include "support/test_util.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/compute/cpu/sum_of_squares.h"

namespace tandem::testing {

template <typename Elem>
void check_block_sums(ComputeBackend& backend) {
  SCOPED_TRACE((std::is_same_v<Elem, float> ? "fp32" : "bf16"));
  const size_t block = kSumOfSquaresBlock, n = 5 * block + 1234;
  // Blocks of far apart magnitudes, so that the order in which block sums are added shows.
  std::vector<float> values = randn(n, 77, 3.0f);
  for (size_t i = 0; i < n; i++) values[i] *= (i / block) % 2 == 0 ? 1e-3f : 1e4f;
  const std::vector<Elem> host = stored<Elem>(values);
  Buffer x = backend.allocate(n * sizeof(Elem));
  backend.copy_from_host(x.as<void>(), host.data(), n * sizeof(Elem));
  const Elem* data = x.as<const Elem>();
  std::vector<double> all((n + block - 1) / block);
  StorageKernels<Elem>& kernels = backend.kernels<Elem>();
  kernels.sum_of_squares_blocks(data, n, all.data());
  EXPECT_EQ(sum_in_order(all.data(), all.size()), kernels.sum_of_squares(data, n));
  for (size_t first_block : {size_t{0}, size_t{1}, size_t{3}}) {
    for (size_t length : {block, 2 * block + 7, n - first_block * block}) {
      if (first_block * block + length > n) continue;
      std::vector<double> piece((length + block - 1) / block, -1.0);
      kernels.sum_of_squares_blocks(data + first_block * block, length, piece.data());
      const bool last_is_short = length % block != 0 && first_block * block + length < n;
      for (size_t k = 0; k < piece.size(); k++) {
        if (last_is_short && k + 1 == piece.size()) continue;  // a shorter block than the buffer's
        EXPECT_EQ(piece[k], all[first_block + k]) << "block " << first_block + k;
      }
    }
  }
}

}  // namespace tandem::testing
