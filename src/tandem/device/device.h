// The device layer: memory spaces, streams (ordered asynchronous queues), events and
// asynchronous copies, behind one interface. The update engine (offload/) is written
// against it and never knows which backend runs underneath:
// - cpu (device/cpu/): host only. "Device" memory is a separate arena with an
//   enforced capacity (allocating past it fails as a GPU out-of-memory does), streams
//   are worker threads, copies are memcpy on those threads. It exercises every
//   schedule, memory limit and overlap without a GPU; it claims nothing about GPU speed.
// - cuda: the same interface over CUDA streams, events, cudaHostAlloc and
//   cudaMemcpyAsync (the CUDA backend issue).
// Kernels of the libraries above (optimizer updates) reach a stream through launch_async
// with a variant per kind of device (DeviceKernel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "tandem/core/enum_names.h"
#include "tandem/core/error.h"
#include "tandem/core/trace.h"
#include "tandem/device/device_kind.h"

namespace tandem {

enum class MemorySpace {
  kDevice,      // accelerator memory (the CPU backend's capacity-limited arena)
  kPinnedHost,  // page-locked host memory: the only host memory async copies overlap with
  kHost,        // ordinary host memory
};
inline constexpr EnumName<MemorySpace> kMemorySpaceNames[] = {
    {MemorySpace::kDevice, "device"},
    {MemorySpace::kPinnedHost, "pinned_host"},
    {MemorySpace::kHost, "host"}};
constexpr std::string_view memory_space_name(MemorySpace space) {
  return enum_name(kMemorySpaceNames, space);
}

// Thrown when device memory is exhausted; the message gives the bytes asked for, in
// use and available, and the setting that controls the capacity.
class DeviceOutOfMemory : public Error {
 public:
  using Error::Error;
};

class Device;

// Memory in one space, released on destruction.
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  DeviceAllocation(Device* device, MemorySpace space, void* data, size_t bytes)
      : device_(device), space_(space), data_(data), bytes_(bytes) {}
  ~DeviceAllocation() { reset(); }
  DeviceAllocation(DeviceAllocation&& other) noexcept { *this = std::move(other); }
  DeviceAllocation& operator=(DeviceAllocation&& other) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void reset();
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemorySpace space() const { return space_; }

 private:
  Device* device_ = nullptr;
  MemorySpace space_ = MemorySpace::kHost;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// An ordered queue of asynchronous work. Work on one stream runs in order; work on
// different streams may overlap. A failure inside queued work is reported by the next
// synchronize() on the stream (or on an event recorded after it) as a tandem::Error,
// and the stream refuses further work: like a CUDA sticky error, it is not recoverable.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual std::string_view name() const = 0;
  // Blocks until all work queued so far is done; rethrows a failure.
  virtual void synchronize() = 0;
};

// A point in a stream's work. wait() makes another stream wait for it; synchronize()
// blocks the host until it is reached.
class Event {
 public:
  virtual ~Event() = default;
  virtual void synchronize() = 0;
  // Whether the work before the event has completed (non-blocking).
  virtual bool ready() = 0;
};

// Work that a library above the device layer queues on a stream (an optimizer's update),
// written once per kind of device: the layer itself knows memory, streams, events and
// copies, and no optimizer.
struct DeviceKernel {
  std::string name;       // what a trace calls it when no label is given ("adamw")
  size_t work_items = 0;  // for the trace (parameters updated)
  // The host-only device: runs on the stream's thread, in order with its other work.
  std::function<void()> on_host;
  // A CUDA device: launches on the stream (a cudaStream_t, as void* so that this header
  // needs no CUDA headers). Empty where the kernel has no GPU version.
  std::function<void(void* cuda_stream)> on_cuda;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string_view name() const = 0;
  virtual DeviceKind kind() const = 0;

  // ---- memory ---------------------------------------------------------------
  // Throws DeviceOutOfMemory for kDevice beyond the capacity. Contents undefined.
  virtual DeviceAllocation allocate(MemorySpace space, size_t bytes) = 0;
  virtual size_t device_capacity() const = 0;
  virtual size_t device_in_use() const = 0;
  size_t device_free() const { return device_capacity() - device_in_use(); }

  // ---- streams and events -----------------------------------------------------
  virtual std::unique_ptr<Stream> create_stream(std::string name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // Marks the event at the current end of the stream's queue.
  virtual void record(Event& event, Stream& stream) = 0;
  // Work queued on `stream` after this call starts only once `event` is reached.
  virtual void wait(Stream& stream, Event& event) = 0;
  // Any thread may queue work; one that did not make the device calls this first (a CUDA
  // device is current per thread).
  virtual void use_on_this_thread() = 0;

  // ---- asynchronous work ------------------------------------------------------
  // Copies bytes between any two spaces, in order on the stream. `label` names the
  // work in a trace (e.g. "sg 3 prefetch").
  virtual void copy_async(void* dst, const void* src, size_t bytes, Stream& stream,
                          std::string_view label = {}) = 0;
  // Queues a kernel of a library above this layer (an optimizer's update: optim/) on the
  // stream, in order with its other work; the device runs the variant for its kind. The
  // kernel's arrays must stay valid until the stream has run it. Throws tandem::Error when
  // the kernel has no variant for this device.
  virtual void launch_async(const DeviceKernel& kernel, Stream& stream,
                            std::string_view label = {}) = 0;

  // Work queued while `tracer` is enabled is recorded as slices on a lane named after
  // its stream. Null turns tracing off. The tracer must outlive the queued work.
  virtual void set_tracer(TraceRecorder* tracer) = 0;

 protected:
  friend class DeviceAllocation;
  virtual void release(MemorySpace space, void* data, size_t bytes) noexcept = 0;
};

struct CpuDeviceOptions {
  size_t memory_bytes = size_t{1} << 30;  // capacity of the "device" arena (device.memory_gb)
  // Fault injection for tests: the copy with this sequence number (0-based, counted over
  // all streams in the order copies are queued) fails without writing anything.
  int64_t fail_copy_number = -1;
  // Slowness injection for tests: each copy on a stream of this name first sleeps
  // slow_copy_ms (a slow link or disk, so that work ordered after it is seen to wait).
  std::string slow_stream = {};
  double slow_copy_ms = 0;
};

// The host-only test and development backend (see the top of this file).
std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options);

}  // namespace tandem
