#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

#include "tandem/bench/cuda/memcpy_peak.h"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_check.h"

namespace tandem {
namespace {

// The raw resources, released in any case (RAII), errors checked.
struct PeakResources {
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  explicit PeakResources(size_t bytes) {
    try {
      cuda_check(cudaSetDevice(0), "cudaSetDevice");
      cuda_check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
      cuda_check(cudaMalloc(&device, bytes), "cudaMalloc");
      cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      cuda_check(cudaEventCreate(&start), "cudaEventCreate");
      cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
    } catch (...) {
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~PeakResources() { release(); }
  void release() noexcept {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
    cudaFree(device);
    cudaFreeHost(host);
    stream = nullptr;
    start = stop = nullptr;
    device = host = nullptr;
  }
  PeakResources(const PeakResources&) = delete;
  PeakResources& operator=(const PeakResources&) = delete;

  // GB/s of the fastest of `repetitions` copies.
  double best_gb_per_s(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       int repetitions) {
    float best_ms = std::numeric_limits<float>::max();
    for (int i = 0; i < repetitions + 1; i++) {  // the first copy warms up and is not counted
      cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
      cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync");
      cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
      cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      if (i > 0) best_ms = std::min(best_ms, ms);
    }
    return bytes / 1e9 / (best_ms / 1e3);
  }
};

}  // namespace

MemcpyPeak measure_memcpy_peak(size_t bytes, int repetitions) {
  TANDEM_CHECK(bytes >= 1 && repetitions >= 1, "memcpy peak needs bytes >= 1, repetitions >= 1");
  PeakResources r(bytes);
  MemcpyPeak peak;
  peak.h2d_gb_per_s = r.best_gb_per_s(r.device, r.host, bytes, cudaMemcpyHostToDevice, repetitions);
  peak.d2h_gb_per_s = r.best_gb_per_s(r.host, r.device, bytes, cudaMemcpyDeviceToHost, repetitions);
  return peak;
}

}  // namespace tandem
