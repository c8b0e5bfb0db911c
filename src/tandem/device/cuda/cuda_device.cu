#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/device/cuda/cuda_check.h"
#include "tandem/device/cuda/cuda_device.h"

namespace tandem {
namespace {

class CudaStream final : public Stream {
 public:
  CudaStream(const void* owner, std::string name) : owner_(owner), name_(std::move(name)) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaStream() override {
    cudaStreamSynchronize(stream_);  // queued work must not outlive its buffers
    cudaStreamDestroy(stream_);
  }
  std::string_view name() const override { return name_; }
  void synchronize() override {
    const cudaError_t err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) fail("stream '", name_, "': ", cudaGetErrorString(err));
  }
  cudaStream_t get() const { return stream_; }
  const void* owner() const { return owner_; }

 private:
  const void* owner_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(const void* owner) : owner_(owner) {
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  void synchronize() override { cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  bool ready() override { return cudaEventQuery(event_) == cudaSuccess; }
  cudaEvent_t get() const { return event_; }
  const void* owner() const { return owner_; }

 private:
  const void* owner_;
  cudaEvent_t event_ = nullptr;
};

// A traced piece of stream work: host functions on the stream before and after it
// stamp the times (they run in stream order, when the work before them is done).
struct TraceMark {
  TraceRecorder* tracer;
  std::string lane, label;
  nlohmann::json args;
  double begin_us = 0;
};

void CUDART_CB trace_begin(void* data) {
  auto* mark = static_cast<TraceMark*>(data);
  mark->begin_us = mark->tracer->now_us();
}

void CUDART_CB trace_end(void* data) {
  auto* mark = static_cast<TraceMark*>(data);
  mark->tracer->slice(mark->lane, mark->label, mark->begin_us, mark->tracer->now_us(), mark->args);
  delete mark;
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceOptions& options) : index_(options.device_index) {
    cuda_check(cudaSetDevice(index_), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, index_), "cudaGetDeviceProperties");
    name_ = std::string("cuda:") + std::to_string(index_) + " (" + prop.name + ")";
    size_t free_bytes = 0, total_bytes = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    capacity_ = options.memory_bytes == 0 ? free_bytes : std::min(options.memory_bytes, free_bytes);
  }

  std::string_view name() const override { return name_; }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  int index() const { return index_; }

  DeviceAllocation allocate(MemorySpace space, size_t bytes) override {
    cuda_check(cudaSetDevice(index_), "cudaSetDevice");
    void* data = nullptr;
    switch (space) {
      case MemorySpace::kDevice: {
        const size_t used = in_use_.fetch_add(bytes) + bytes;
        if (used > capacity_) {
          in_use_.fetch_sub(bytes);
          throw DeviceOutOfMemory(cat("device out of memory: asked for ", format_bytes(bytes),
                                      " with ", format_bytes(used - bytes), " of ",
                                      format_bytes(capacity_), " in use on ", name_,
                                      "; raise device.memory_gb or offload more"));
        }
        const cudaError_t err = cudaMalloc(&data, bytes == 0 ? 1 : bytes);
        if (err != cudaSuccess) {
          in_use_.fetch_sub(bytes);
          cudaGetLastError();  // an allocation failure is not sticky: clear it
          throw DeviceOutOfMemory(cat("device out of memory: cudaMalloc of ", format_bytes(bytes),
                                      " failed on ", name_, " (", cudaGetErrorString(err),
                                      "); lower device.memory_gb or offload more"));
        }
        break;
      }
      case MemorySpace::kPinnedHost:
        cuda_check(cudaHostAlloc(&data, bytes == 0 ? 1 : bytes, cudaHostAllocDefault),
                   "cudaHostAlloc (pinned host memory)");
        break;
      case MemorySpace::kHost:
        data = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{64});
        break;
    }
    return DeviceAllocation(this, space, data, bytes);
  }

  size_t device_capacity() const override { return capacity_; }
  size_t device_in_use() const override { return in_use_.load(); }

  std::unique_ptr<Stream> create_stream(std::string name) override {
    cuda_check(cudaSetDevice(index_), "cudaSetDevice");
    return std::make_unique<CudaStream>(this, std::move(name));
  }
  std::unique_ptr<Event> create_event() override {
    cuda_check(cudaSetDevice(index_), "cudaSetDevice");
    return std::make_unique<CudaEvent>(this);
  }
  void record(Event& event, Stream& stream) override {
    cuda_check(cudaEventRecord(own(event).get(), own(stream).get()), "cudaEventRecord");
  }
  void wait(Stream& stream, Event& event) override {
    cuda_check(cudaStreamWaitEvent(own(stream).get(), own(event).get(), 0), "cudaStreamWaitEvent");
  }
  void use_on_this_thread() override { cuda_check(cudaSetDevice(index_), "cudaSetDevice"); }

  void copy_async(void* dst, const void* src, size_t bytes, Stream& stream,
                  std::string_view label) override {
    CudaStream& s = own(stream);
    TraceMark* mark = begin_trace(s, label.empty() ? "copy" : label, {{"bytes", bytes}});
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.get()), "cudaMemcpyAsync");
    end_trace(s, mark);
  }

  void launch_async(const DeviceKernel& kernel, Stream& stream, std::string_view label) override {
    TANDEM_CHECK(kernel.on_cuda != nullptr, "kernel '", kernel.name,
                 "' has no version for a CUDA device");
    CudaStream& s = own(stream);
    TraceMark* mark = begin_trace(s, label.empty() ? std::string_view(kernel.name) : label,
                                  {{"items", kernel.work_items}});
    kernel.on_cuda(s.get());
    end_trace(s, mark);
  }

  void set_tracer(TraceRecorder* tracer) override { tracer_ = tracer; }

 protected:
  void release(MemorySpace space, void* data, size_t bytes) noexcept override {
    switch (space) {
      case MemorySpace::kDevice:
        cudaFree(data);
        in_use_.fetch_sub(bytes);
        break;
      case MemorySpace::kPinnedHost:
        cudaFreeHost(data);
        break;
      case MemorySpace::kHost:
        ::operator delete (data, std::align_val_t{64});
        break;
    }
  }

 private:
  CudaStream& own(Stream& stream) {
    auto* s = dynamic_cast<CudaStream*>(&stream);
    TANDEM_CHECK(s != nullptr && s->owner() == this, "a stream of another device was used on ",
                 name_);
    return *s;
  }
  CudaEvent& own(Event& event) {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    TANDEM_CHECK(e != nullptr && e->owner() == this, "an event of another device was used on ",
                 name_);
    return *e;
  }

  TraceMark* begin_trace(CudaStream& stream, std::string_view label, nlohmann::json args) {
    if (tracer_ == nullptr || !tracer_->enabled()) return nullptr;
    auto* mark =
        new TraceMark{tracer_, std::string(stream.name()), std::string(label), std::move(args)};
    cuda_check(cudaLaunchHostFunc(stream.get(), trace_begin, mark), "cudaLaunchHostFunc");
    return mark;
  }
  void end_trace(CudaStream& stream, TraceMark* mark) {
    if (mark != nullptr)
      cuda_check(cudaLaunchHostFunc(stream.get(), trace_end, mark), "cudaLaunchHostFunc");
  }

  int index_;
  std::string name_;
  size_t capacity_ = 0;
  std::atomic<size_t> in_use_{0};
  TraceRecorder* tracer_ = nullptr;
};

}  // namespace

int cuda_device_index(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  TANDEM_CHECK(cuda != nullptr, "device '", device.name(), "' is not a CUDA device");
  return cuda->index();
}

void* cuda_stream_handle(Stream& stream) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  TANDEM_CHECK(cuda != nullptr, "stream '", stream.name(), "' is not a CUDA stream");
  return cuda->get();
}

int cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = cat("no usable CUDA GPU (", cudaGetErrorString(err), ")");
    cudaGetLastError();
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA GPU found";
  return count;
}

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) {
  std::string why;
  const int count = cuda_device_count(&why);
  TANDEM_CHECK(count > 0, "cannot use a CUDA GPU: ", why,
               " (without a GPU, tandem runs on the cpu device: device.type = \"cpu\")");
  TANDEM_CHECK(options.device_index >= 0 && options.device_index < count, "CUDA device ",
               options.device_index, " does not exist (", count, " found)");
  return std::make_unique<CudaDevice>(options);
}

}  // namespace tandem
