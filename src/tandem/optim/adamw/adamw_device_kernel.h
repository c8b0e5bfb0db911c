// AdamW as a kernel any device runs (device.h, DeviceKernel): on the host-only device the
// SIMD kernel of `target` (adamw_simd.h) on the stream's thread, on a CUDA device the CUDA
// kernel (adamw_cuda.h), both computing exactly adamw_reference's operations. The segments
// are copied into the kernel; the arrays must stay valid until the stream has run it.
#pragma once

#include <cstddef>
#include <span>

#include "tandem/core/cpu_features.h"
#include "tandem/device/device.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

DeviceKernel adamw_device_kernel(const AdamWArrays& arrays, std::span<const UpdateSegment> segments,
                                 const AdamWStepScalars& with_decay,
                                 const AdamWStepScalars& without_decay,
                                 SimdTarget target = best_simd_target());
// Elements [0, n) with one set of scalars.
DeviceKernel adamw_device_kernel(const AdamWArrays& arrays, size_t n,
                                 const AdamWStepScalars& scalars,
                                 SimdTarget target = best_simd_target());

}  // namespace tandem
