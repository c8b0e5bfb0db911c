// Stands in for the CUDA toolkit's cuda_runtime.h in emulated builds (see ../README.md):
// the runtime types and device built-ins that emulated source uses come from the emulator.
#pragma once

#include "../simt_emulator.h"

// The vector types that kernels load 8 and 16 bytes at a time through, with the toolkit's
// alignment.
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// Errors: an emulated launch reports a fault by throwing (cuda_emulation::EmulationError),
// so there is never a launch error left to find.
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t err) {
  return err == cudaSuccess ? "no error" : "invalid argument";
}
