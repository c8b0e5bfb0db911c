// Stands in for the CUDA toolkit's cuda_runtime.h in emulated builds (see ../README.md):
// the runtime types and device built-ins that emulated source uses come from the emulator.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>

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
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    default:
      return "invalid argument";
  }
}

// "Device memory" is host memory, 256-byte aligned as cudaMalloc's is, and starts as 0xff
// bytes (NaN in float and bf16) so that a read before any write stands out. Streams are
// ignored: an asynchronous call finishes before it returns.
namespace cuda_emulation {
inline int& live_allocations() {
  static int count = 0;
  return count;
}
}  // namespace cuda_emulation

inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{256}, std::nothrow);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);
  cuda_emulation::live_allocations()++;
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  ::operator delete (p, std::align_val_t{256}, std::nothrow);
  cuda_emulation::live_allocations()--;
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t = nullptr) {
  if (p == nullptr && bytes != 0) return cudaErrorInvalidValue;
  if (bytes != 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
