// SIMD AdamW kernels, one per instruction set, selected at run time. Each computes
// exactly adamw_reference's IEEE operations in the same order (mul, fma, sqrt, div are
// correctly rounded in every instruction set), so every target gives the same bits;
// the tail that does not fill a vector runs through the reference itself.
#pragma once

#include <cstddef>

#include "tandem/core/cpu_features.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

// Single-threaded update of n elements with the given target (which the CPU must
// support; see cpu_supports).
void adamw_kernel(SimdTarget target, const AdamWArrays& arrays, size_t n,
                  const AdamWStepScalars& s);

// The per-target kernels behind adamw_kernel.
void adamw_avx2(const AdamWArrays& arrays, size_t n, const AdamWStepScalars& s);
void adamw_avx512(const AdamWArrays& arrays, size_t n, const AdamWStepScalars& s);

}  // namespace tandem
