// The DCT side of DeMo (arXiv 2411.19870): how a tensor is
// tiled into blocks, and each block's orthonormal DCT-II and its inverse, in float32 with a
// fixed order of explicit FMAs so that a CUDA kernel can reproduce every bit.
//
// Tiling. For each dimension of size n the chunk is the largest divisor of n that is at
// most `compression_chunk` (n itself when n <= chunk): 64 -> 64, 96 -> 48, 80 -> 40,
// 50280 -> 60, 37 -> 37, a prime above the chunk -> 1. A 2-D tensor [m, n] is tiled into
// blocks of c_m x c_n, numbered row-major over the grid of blocks; a 1-D tensor of n into
// blocks of c_n (c_m = 1). Coefficient f_row * c_n + f_col of a block is frequency
// (f_row, f_col). Tensors of 0 or more than 2 dimensions are refused.
//
// Transform. Z = C_m X C_n^T, with C[k, j] = s_k cos(pi (2j + 1) k / 2N), s_0 = sqrt(1/N),
// s_k = sqrt(2/N), each entry computed in double and rounded once to float. Order: first
// along rows, Y[a][l] = sum over b of X[a][b] C_n[l][b], then along columns, Z[k][l] = sum
// over a of C_m[k][a] Y[a][l]. The inverse is X = C_m^T Z C_n in the same pattern:
// Y[k][b] = sum over l of Z[k][l] C_n[l][b], X[a][b] = sum over k of C_m[k][a] Y[k][b].
// Every sum is combine_rows's (demo_simd.h): it starts at +0 and adds its terms in
// ascending index, each with one fma. The inverse's first stage skips the terms whose Z is
// 0, its second the terms whose Y is 0 (and so every row k of Z that holds no nonzero), so
// the inverse of a sparse Z (the top-k kept, the decoded means) costs what its nonzeros and
// their rows cost. Every SIMD target gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/core/cpu_features.h"

namespace tandem {

// The largest divisor of n that is at most chunk (n itself when n <= chunk); chunk >= 1.
int64_t demo_chunk(int64_t n, int64_t chunk);

// The orthonormal DCT-II matrix of size n x n, row k = frequency k, as float.
std::vector<float> dct_matrix(int64_t n);

class DemoBlocks {
 public:
  // Throws tandem::Error naming `name` for a tensor of 0 or more than 2 dimensions, and for
  // a chunk below 1.
  DemoBlocks(const std::vector<int64_t>& shape, int64_t chunk, const char* name = "tensor",
             SimdTarget target = best_simd_target());

  int64_t rows() const { return rows_; }  // 1 for a 1-D tensor
  int64_t cols() const { return cols_; }
  int64_t block_rows() const { return cm_; }
  int64_t block_cols() const { return cn_; }
  // Blocks of the tensor, and coefficients of a block.
  int64_t count() const { return (rows_ / cm_) * (cols_ / cn_); }
  int64_t block_size() const { return cm_ * cn_; }
  int64_t num_elements() const { return rows_ * cols_; }

  // z[block_size] = the DCT of block `block` of x (row-major [rows, cols]).
  void forward(const float* x, int64_t block, float* z) const;
  // out[element of block `block`] = IDCT(z).
  void inverse(const float* z, int64_t block, float* out) const;
  // IDCT(z) into x [block_size], row-major within the block (block_rows() rows of
  // block_cols()): for a caller that uses the block's values where they are made.
  void inverse_block(const float* z, float* x) const;
  // The same from z's nonzeros alone: values[t] at coefficient indices[t], t < count, the
  // indices ascending (a value 0 is skipped, as a dense z's zeros are). A caller that holds
  // the few coefficients it kept or received saves the scan of the block for them.
  void inverse_sparse(const int32_t* indices, const float* values, size_t count, float* x) const;
  // Where block `block` starts in a [rows, cols] tensor: its row a is the block_cols()
  // elements from block_origin(block) + a * cols().
  int64_t block_origin(int64_t block) const;

 private:
  int64_t rows_ = 1, cols_ = 1, cm_ = 1, cn_ = 1;
  std::vector<float> c_m_, c_n_;  // [cm, cm], [cn, cn]
  std::vector<float> c_n_t_;      // C_n transposed: the rows of the forward's first stage
  SimdTarget target_;
};

}  // namespace tandem
