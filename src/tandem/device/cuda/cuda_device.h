// The `cuda` device backend: the device layer (device.h) over CUDA. Device memory is
// cudaMalloc'ed and accounted against a capacity (device.memory_gb, or all memory free
// when the device is made); pinned host memory is cudaHostAlloc'ed; streams and events
// are CUDA streams and events; copies are cudaMemcpyAsync; launch_async runs a kernel's
// CUDA variant on the stream. A CUDA error is sticky: a stream that saw one reports it at its
// next synchronize and training cannot continue.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tandem/device/device.h"

namespace tandem {

struct CudaDeviceOptions {
  int device_index = 0;
  size_t memory_bytes = 0;  // capacity for tandem's device allocations; 0: all free memory
};

// The number of CUDA GPUs this process can use: 0 when tandem was built without CUDA
// or the driver finds none, with the reason in `why` (for tests that must say why they
// skip).
int cuda_device_count(std::string* why = nullptr);

// Throws tandem::Error when built without CUDA or when the GPU cannot be used.
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options);

// For CUDA code working on a `cuda` device's streams (the CUDA compute backend): the
// GPU index of the device, and the cudaStream_t behind one of its streams (as void*,
// so that this header needs no CUDA headers). Throw tandem::Error for another device's.
int cuda_device_index(Device& device);
void* cuda_stream_handle(Stream& stream);

}  // namespace tandem
