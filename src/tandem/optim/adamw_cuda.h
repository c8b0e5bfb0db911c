// The CUDA AdamW kernel: adamw_element (adamw_math.h) on every element, so the device
// update is bit-identical to the CPU reference. Declared without CUDA headers so that
// host code can call it; defined only in CUDA builds (TANDEM_HAVE_CUDA).
#pragma once

#include <cstddef>

#include "tandem/optim/adamw_reference.h"

namespace tandem {

// Queues the update of n elements (all arrays in device memory) on `stream`, a
// cudaStream_t. Throws tandem::Error if the launch fails.
void launch_adamw_cuda(const AdamWArrays& arrays, size_t n, const AdamWStepScalars& scalars,
                       void* stream);

}  // namespace tandem
