// Checked CUDA runtime calls for CUDA sources: a failure becomes a tandem::Error
// naming the call.
#pragma once

#include <cuda_runtime.h>

#include "tandem/core/error.h"

namespace tandem {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(err));
}

}  // namespace tandem
