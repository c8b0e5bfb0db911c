// Stands in for the CUDA toolkit's cuda_runtime.h in emulated builds (see ../README.md):
// the runtime types and device built-ins that emulated source uses come from the emulator.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "../simt_emulator.h"

// The vector types that kernels load 8 and 16 bytes at a time through, with the toolkit's
// alignment.
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- Errors --------------------------------------------------------------------------
// An emulated launch reports a fault by throwing (cuda_emulation::EmulationError), so a
// launch never leaves an error behind. A runtime call that fails returns its error and, as
// documented for the CUDA runtime, also records it as the calling host thread's last error,
// which cudaGetLastError returns and resets (cudaPeekAtLastError leaves it). None of these
// errors is sticky. The values are the toolkit's.
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
};

namespace cuda_emulation {
inline cudaError_t& last_error() {
  thread_local cudaError_t error = cudaSuccess;
  return error;
}
// Returns `error`, recording it as the last error when it is one.
inline cudaError_t report(cudaError_t error) {
  if (error != cudaSuccess) last_error() = error;
  return error;
}
}  // namespace cuda_emulation

inline cudaError_t cudaGetLastError() {
  const cudaError_t error = cuda_emulation::last_error();
  cuda_emulation::last_error() = cudaSuccess;
  return error;
}
inline cudaError_t cudaPeekAtLastError() { return cuda_emulation::last_error(); }
inline const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    default:
      return "invalid argument";
  }
}

// ---- Devices ---------------------------------------------------------------------------
// One emulated device, 0, of sm_80 (A100-like) limits and kTotalBytes of memory.

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
};

namespace cuda_emulation {
constexpr size_t kDeviceTotalBytes = size_t{8} << 30;  // what cudaMemGetInfo reports as total
}  // namespace cuda_emulation

inline cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cuda_emulation::report(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  return cuda_emulation::report(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return cuda_emulation::report(cudaErrorInvalidValue);
  if (device != 0) return cuda_emulation::report(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strcpy(prop->name, "emulated GPU");
  prop->totalGlobalMem = cuda_emulation::kDeviceTotalBytes;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 163 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 8;
  prop->minor = 0;
  prop->multiProcessorCount = 108;
  return cudaSuccess;
}

// ---- Memory ----------------------------------------------------------------------------
// "Device memory" is host memory, 256-byte aligned as cudaMalloc's is, and starts as 0xff
// bytes (NaN in float and bf16) so that a read before any write stands out. Its bytes are
// counted against kDeviceTotalBytes: cudaMemGetInfo reports the rest as free, and a
// cudaMalloc of more fails with cudaErrorMemoryAllocation. Pinned host memory
// (cudaHostAlloc) is host memory too, also filled with 0xff bytes.
namespace cuda_emulation {
struct Allocations {
  std::mutex mutex;
  std::map<const void*, size_t> device;  // live cudaMalloc blocks and their sizes
  std::map<const void*, size_t> pinned;  // live cudaHostAlloc blocks
  size_t device_bytes = 0;
};
inline Allocations& allocations() {
  static Allocations a;
  return a;
}
// The number of live cudaMalloc blocks (what a test checks is back to where it was).
inline int live_allocations() {
  Allocations& a = allocations();
  std::lock_guard<std::mutex> lock(a.mutex);
  return static_cast<int>(a.device.size());
}
inline void* allocate_filled(size_t bytes) {
  void* p = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{256}, std::nothrow);
  if (p != nullptr) std::memset(p, 0xff, bytes);
  return p;
}
}  // namespace cuda_emulation

inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return cuda_emulation::report(cudaErrorInvalidValue);
  cuda_emulation::Allocations& a = cuda_emulation::allocations();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    if (bytes > cuda_emulation::kDeviceTotalBytes - a.device_bytes) {
      return cuda_emulation::report(cudaErrorMemoryAllocation);
    }
    a.device_bytes += bytes;
  }
  *p = cuda_emulation::allocate_filled(bytes);
  std::lock_guard<std::mutex> lock(a.mutex);
  if (*p == nullptr) {
    a.device_bytes -= bytes;
    return cuda_emulation::report(cudaErrorMemoryAllocation);
  }
  a.device[*p] = bytes;
  return cudaSuccess;
}
// Like the runtime's, cudaFree and cudaFreeHost first wait for all queued work.
inline cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  cuda_emulation::stream_scheduler().drain_all();
  cuda_emulation::Allocations& a = cuda_emulation::allocations();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    const auto it = a.device.find(p);
    if (it == a.device.end()) return cuda_emulation::report(cudaErrorInvalidValue);
    a.device_bytes -= it->second;
    a.device.erase(it);
  }
  ::operator delete (p, std::align_val_t{256}, std::nothrow);
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return cuda_emulation::report(cudaErrorInvalidValue);
  }
  cuda_emulation::Allocations& a = cuda_emulation::allocations();
  std::lock_guard<std::mutex> lock(a.mutex);
  *total_bytes = cuda_emulation::kDeviceTotalBytes;
  *free_bytes = cuda_emulation::kDeviceTotalBytes - a.device_bytes;
  return cudaSuccess;
}

enum { cudaHostAllocDefault = 0, cudaHostAllocPortable = 1, cudaHostAllocMapped = 2 };
inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int /*flags*/) {
  if (p == nullptr) return cuda_emulation::report(cudaErrorInvalidValue);
  *p = cuda_emulation::allocate_filled(bytes);
  if (*p == nullptr) return cuda_emulation::report(cudaErrorMemoryAllocation);
  cuda_emulation::Allocations& a = cuda_emulation::allocations();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.pinned[*p] = bytes;
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  cuda_emulation::stream_scheduler().drain_all();
  cuda_emulation::Allocations& a = cuda_emulation::allocations();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    if (a.pinned.erase(p) == 0) return cuda_emulation::report(cudaErrorInvalidValue);
  }
  ::operator delete (p, std::align_val_t{256}, std::nothrow);
  return cudaSuccess;
}

// ---- Streams, events and asynchronous operations ---------------------------------------
// Stream work (copies, memsets, kernel launches, host functions, event records) runs in the
// order that ../emulated_streams.h sets: by default each operation runs to completion on
// the calling thread before the call returns, so every stream is trivially in order, an
// event is complete when it is recorded, and no missing cross-stream synchronisation can
// show; with set_stream_order(kLazy or kRandom) work is queued per stream and runs only as
// CUDA promises (stream order, events), when the host synchronises.
struct CUstream_st {
  unsigned int flags;
};
struct CUevent_st {
  unsigned int flags;
  bool recorded = false;  // a record has completed
  std::chrono::steady_clock::time_point when;
};
typedef struct CUevent_st* cudaEvent_t;

#define CUDART_CB
typedef void (*cudaHostFn_t)(void* user_data);
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

namespace cuda_emulation {
// Whether p lies in a cudaMalloc or cudaHostAlloc block (otherwise: pageable host memory).
inline bool runtime_allocated(const void* p) {
  Allocations& a = allocations();
  std::lock_guard<std::mutex> lock(a.mutex);
  for (const auto* blocks : {&a.device, &a.pinned}) {
    auto it = blocks->upper_bound(p);
    if (it == blocks->begin()) continue;
    --it;
    if (static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second) return true;
  }
  return false;
}
}  // namespace cuda_emulation

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags & ~1u) != 0) return cuda_emulation::report(cudaErrorInvalidValue);
  *stream = new CUstream_st{flags};
  cuda_emulation::stream_scheduler().stream_created(*stream);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr) return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  cuda_emulation::stream_scheduler().stream_destroyed(stream);
  delete stream;
  return cudaSuccess;
}
// Null is the legacy default stream: it waits for everything.
inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cuda_emulation::stream_scheduler().drain_stream(stream);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  cuda_emulation::stream_scheduler().drain_all();
  return cudaSuccess;
}

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr || (flags & ~3u) != 0) return cuda_emulation::report(cudaErrorInvalidValue);
  *event = new CUevent_st{flags, false, {}};
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  cuda_emulation::stream_scheduler().event_destroyed(event);
  delete event;
  return cudaSuccess;
}
// The event completes (and takes its time stamp) once the work queued before it has run.
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
  if (event == nullptr) return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  cuda_emulation::stream_scheduler().record(event, stream, [event] {
    event->recorded = true;
    event->when = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}
// As documented, an event that was never recorded counts as complete.
inline cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  return cuda_emulation::stream_scheduler().query_event(event) ? cudaSuccess : cudaErrorNotReady;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  cuda_emulation::stream_scheduler().drain_event(event);
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return cuda_emulation::report(cudaErrorInvalidValue);
  if (start == nullptr || end == nullptr ||
      ((start->flags | end->flags) & cudaEventDisableTiming)) {
    return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  }
  if (!start->recorded || !end->recorded)
    return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                       unsigned int flags = 0) {
  if (event == nullptr) return cuda_emulation::report(cudaErrorInvalidResourceHandle);
  if (flags != 0) return cuda_emulation::report(cudaErrorInvalidValue);
  cuda_emulation::stream_scheduler().wait(stream, event);
  return cudaSuccess;
}

// As on a GPU, a copy from pageable host memory reads its source before the call returns
// (the runtime stages it), and a copy into pageable host memory returns once it is done.
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
  if (static_cast<int>(kind) < 0 || static_cast<int>(kind) > cudaMemcpyDefault) {
    return cuda_emulation::report(cudaErrorInvalidValue);
  }
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cuda_emulation::report(cudaErrorInvalidValue);
  auto& scheduler = cuda_emulation::stream_scheduler();
  if (!cuda_emulation::runtime_allocated(dst)) {
    scheduler.drain_stream(stream);
    std::memmove(dst, src, bytes);
  } else if (!cuda_emulation::runtime_allocated(src)) {
    const auto* first = static_cast<const unsigned char*>(src);
    scheduler.submit(stream, [dst, staged = std::vector<unsigned char>(first, first + bytes)] {
      std::memcpy(dst, staged.data(), staged.size());
    });
  } else {
    scheduler.submit(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes,
                                   cudaStream_t stream = nullptr) {
  if (p == nullptr && bytes != 0) return cuda_emulation::report(cudaErrorInvalidValue);
  if (bytes != 0) {
    cuda_emulation::stream_scheduler().submit(stream,
                                              [p, value, bytes] { std::memset(p, value, bytes); });
  }
  return cudaSuccess;
}
// The host function runs, on a host thread, once the stream's earlier work is done.
inline cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return cuda_emulation::report(cudaErrorInvalidValue);
  cuda_emulation::stream_scheduler().submit(stream, [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}
