// The one primitive DeMo's DCT is made of (demo_transform.h), per instruction set:
//
//   out[i] = sum over j = 0, 1, ..., m - 1 of coeffs[j * coeff_stride] * rows[j * row_stride + i]
//
// for i < n, each term added with one fma into an accumulator that starts at +0, in
// ascending j, and a term whose coefficient is 0 skipped. Vectorised across i, every lane
// performs exactly the scalar sequence, so every target (and a GPU thread per output) gives
// the same bits.
#pragma once

#include <cstddef>

#include "tandem/core/cpu_features.h"

namespace tandem {

void combine_rows(SimdTarget target, float* out, const float* coeffs, size_t coeff_stride,
                  const float* rows, size_t row_stride, size_t m, size_t n);

}  // namespace tandem
