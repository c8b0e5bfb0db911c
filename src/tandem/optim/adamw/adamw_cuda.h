// The CUDA AdamW kernel: adamw_element (adamw_math.h) on every element, so the device
// update is bit-identical to the CPU reference. Declared without CUDA headers so that
// host code can call it; defined only in CUDA builds (TANDEM_HAVE_CUDA).
#pragma once

#include <cstddef>

#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

// Queues the update of `segments` of the arrays (all in device memory; each segment with
// or without weight decay) on `stream`, a cudaStream_t: one launch for up to
// kAdamWSegmentsPerLaunch segments. Throws tandem::Error if a launch fails.
inline constexpr size_t kAdamWSegmentsPerLaunch = 128;
void launch_adamw_cuda(const AdamWArrays& arrays, const UpdateSegment* segments,
                       size_t num_segments, const AdamWStepScalars& with_decay,
                       const AdamWStepScalars& without_decay, void* stream);

}  // namespace tandem
