// The one primitive DeMo's DCT is made of (demo_transform.h), per instruction set: a small
// matrix product with a fixed order of operations,
//
//   out[r][i] = sum over j = 0, 1, ..., m - 1 of coeffs[r][j] * rows[j][i]   (r < R, i < n)
//
// each term added with one fma into an accumulator that starts at +0, in ascending j. Which
// terms are skipped (CombineSkip): none; or those whose rows[j][i] is 0 (a sparse right
// factor: the caller leaves out its all-zero rows, and the zeros of the rows it passes are
// skipped element by element, so leaving a row out or passing it gives the same bits). A
// sparse left factor goes to combine_sparse_row, which takes its nonzeros alone. A skipped
// term changes nothing a computed one would not, except the sign of a zero sum, or where the
// other factor is an infinity or a NaN. The SIMD kernels work on tiles of several r and i at
// once, but every output element goes through exactly the scalar sequence, so every target
// (and a GPU thread per output, skipping the same terms) gives the same bits.
//
// Layouts: out[r][i] at out + r * out_stride + i; coeffs[r][j] at coeffs + r * coeff_row
// + j * coeff_col (so a transposed matrix is a pair of strides); rows[j][i] at rows +
// j * row_stride + i.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/core/cpu_features.h"

namespace tandem {

enum class CombineSkip { kNone, kZeroRowElements };

struct CombineLayout {
  size_t out_stride = 0;
  size_t coeff_row = 0, coeff_col = 1;
  size_t row_stride = 0;
};

void combine_rows(SimdTarget target, float* out, const float* coeffs, const float* rows,
                  const CombineLayout& layout, size_t R, size_t m, size_t n, CombineSkip skip);

// One output row of combine_rows from the nonzero coefficients of its row alone: out[i] =
// sum over t < count of coeffs[t] * rows[js[t]][i] (i < n), from +0, one fma per term, in
// ascending t. With js ascending and coeffs[t] the nonzero coefficients at js[t], these are
// the bits of the whole row's sum with its zero coefficients' terms skipped, at the cost of
// the nonzeros only.
void combine_sparse_row(SimdTarget target, float* out, const float* coeffs, const int32_t* js,
                        size_t count, const float* rows, size_t row_stride, size_t n);

}  // namespace tandem
