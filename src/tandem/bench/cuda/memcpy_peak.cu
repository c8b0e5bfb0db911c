#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "tandem/bench/cuda/memcpy_peak.h"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_check.h"
#include "tandem/device/cuda/cuda_device.h"

namespace tandem {
namespace {

// Two CUDA events, destroyed in any case.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    if (const cudaError_t err = cudaEventCreate(&stop); err != cudaSuccess) {
      cudaEventDestroy(start);
      cuda_check(err, "cudaEventCreate");
    }
  }
  ~EventPair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// GB/s of the fastest of `repetitions` plain cudaMemcpyAsync calls, timed by events.
double best_gb_per_s(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                     cudaStream_t stream, int repetitions) {
  EventPair events;
  float best_ms = std::numeric_limits<float>::max();
  for (int i = 0; i < repetitions + 1; i++) {  // the first copy warms up and is not counted
    cuda_check(cudaEventRecord(events.start, stream), "cudaEventRecord");
    cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync");
    cuda_check(cudaEventRecord(events.stop, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(events.stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, events.start, events.stop), "cudaEventElapsedTime");
    if (i > 0) best_ms = std::min(best_ms, ms);
  }
  return bytes / 1e9 / (best_ms / 1e3);
}

}  // namespace

MemcpyPeak measure_memcpy_peak(Device& device, size_t bytes, int repetitions) {
  TANDEM_CHECK(bytes >= 1 && repetitions >= 1, "memcpy peak needs bytes >= 1, repetitions >= 1");
  // The device layer only provides the memory and the stream; the copies bypass it.
  const DeviceAllocation host = device.allocate(MemorySpace::kPinnedHost, bytes);
  const DeviceAllocation on_device = device.allocate(MemorySpace::kDevice, bytes);
  const std::unique_ptr<Stream> stream = device.create_stream("memcpy peak");
  const auto raw = static_cast<cudaStream_t>(cuda_stream_handle(*stream));
  MemcpyPeak peak;
  peak.h2d_gb_per_s =
      best_gb_per_s(on_device.data(), host.data(), bytes, cudaMemcpyHostToDevice, raw, repetitions);
  peak.d2h_gb_per_s =
      best_gb_per_s(host.data(), on_device.data(), bytes, cudaMemcpyDeviceToHost, raw, repetitions);
  return peak;
}

}  // namespace tandem
