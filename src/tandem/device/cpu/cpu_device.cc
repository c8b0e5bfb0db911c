#include "tandem/device/cpu/cpu_device.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/core/format.h"
#include "tandem/core/huge_pages.h"
#include "tandem/device/cpu/cpu_stream.h"

namespace tandem {
namespace {

// A cache line: vector loads never split one, and no two allocations share one.
constexpr std::align_val_t kAlignment{64};

// "1.50 GiB", "768.00 KiB": readable at any scale, including tests' tiny arenas.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options)
      : capacity_(options.memory_bytes),
        fail_copy_number_(options.fail_copy_number),
        slow_stream_(options.slow_stream),
        slow_copy_ms_(options.slow_copy_ms) {}

  ~CpuDevice() override = default;

  std::string_view name() const override { return "cpu"; }
  DeviceKind kind() const override { return DeviceKind::kHostOnly; }

  DeviceAllocation allocate(MemorySpace space, size_t bytes) override {
    if (space == MemorySpace::kDevice) reserve(bytes);
    void* data = nullptr;
    try {
      // Never size 0, so that every allocation has its own address.
      data = ::operator new(bytes == 0 ? 1 : bytes, kAlignment);
      advise_huge_pages(data, bytes);  // before anything touches it
      // Committed now, as cudaMalloc and cudaHostAlloc commit a GPU's memory.
      populate_pages(data, bytes);
    } catch (const std::bad_alloc&) {
      if (space == MemorySpace::kDevice) in_use_.fetch_sub(bytes);
      fail("host out of memory: could not allocate ", format_bytes(bytes), " of ",
           memory_space_name(space), " memory");
    }
    return DeviceAllocation(this, space, data, bytes);
  }

  size_t device_capacity() const override { return capacity_; }
  size_t device_in_use() const override { return in_use_.load(); }

  std::unique_ptr<Stream> create_stream(std::string name) override {
    return std::make_unique<CpuStream>(this, std::move(name));
  }

  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(this); }

  void record(Event& event, Stream& stream) override {
    auto marker = std::make_shared<EventMarker>();
    // The event refers to the new marker from now on, even before the stream reaches
    // it: synchronize() and ready() after record() wait for this generation.
    own(event).set_latest(marker);
    own(stream).enqueue_marker(std::move(marker));
  }

  void use_on_this_thread() override {}  // nothing is per thread here
  void wait(Stream& stream, Event& event) override {
    CpuStream& waiter = own(stream);
    // The generation is captured now: a later re-record does not change what this waits for.
    std::shared_ptr<EventMarker> marker = own(event).latest();
    if (marker == nullptr) return;  // never recorded: nothing to wait for, as in CUDA
    waiter.enqueue("wait on event", [marker = std::move(marker)] {
      marker->wait();
      // The recording stream failed first: what follows must not run on stale data.
      if (!marker->error().empty()) throw Error(marker->error());
    });
  }

  void set_tracer(TraceRecorder* tracer) override { tracer_ = tracer; }

  void copy_async(void* dst, const void* src, size_t bytes, Stream& stream,
                  std::string_view label) override {
    CpuStream& queue = own(stream);
    TANDEM_CHECK(bytes == 0 || (dst != nullptr && src != nullptr),
                 "copy_async: null pointer for a copy of ", format_bytes(bytes));
    const auto d = reinterpret_cast<uintptr_t>(dst);
    const auto s = reinterpret_cast<uintptr_t>(src);
    TANDEM_CHECK(bytes == 0 || d + bytes <= s || s + bytes <= d,
                 "copy_async: source and destination of a copy of ", format_bytes(bytes),
                 " overlap");
    // Numbered when queued, not when run, so the injected failure hits a copy chosen
    // by program order and not by thread timing.
    const int64_t number = next_copy_number_.fetch_add(1);
    const bool inject = number == fail_copy_number_;
    const double delay_ms =
        !slow_stream_.empty() && queue.name() == slow_stream_ ? slow_copy_ms_ : 0;
    queue.enqueue("copy", traced(queue, label.empty() ? "copy" : label, {{"bytes", bytes}},
                                 [dst, src, bytes, number, inject, delay_ms] {
                                   if (delay_ms > 0)
                                     std::this_thread::sleep_for(
                                         std::chrono::duration<double, std::milli>(delay_ms));
                                   if (inject) fail("injected copy failure (copy #", number, ")");
                                   std::memcpy(dst, src, bytes);
                                 }));
  }

  void launch_async(const DeviceKernel& kernel, Stream& stream, std::string_view label) override {
    TANDEM_CHECK(kernel.on_host != nullptr, "kernel '", kernel.name,
                 "' has no version for the cpu device");
    CpuStream& queue = own(stream);
    queue.enqueue(kernel.name, traced(queue, label.empty() ? std::string_view(kernel.name) : label,
                                      {{"items", kernel.work_items}}, kernel.on_host));
  }

 protected:
  void release(MemorySpace space, void* data, size_t bytes) noexcept override {
    ::operator delete(data, kAlignment);
    if (space == MemorySpace::kDevice) in_use_.fetch_sub(bytes);
  }

 private:
  // Wraps a task so that, when a tracer is enabled at enqueue time, it records itself as
  // a slice on its stream's lane.
  std::function<void()> traced(CpuStream& stream, std::string_view label, nlohmann::json args,
                               std::function<void()> run) {
    TraceRecorder* tracer = tracer_;
    if (tracer == nullptr || !tracer->enabled()) return run;
    return [tracer, lane = std::string(stream.name()), label = std::string(label),
            args = std::move(args), run = std::move(run)] {
      const double begin = tracer->now_us();
      run();
      tracer->slice(lane, label, begin, tracer->now_us(), args);
    };
  }

  // Accounts `bytes` against the arena or throws DeviceOutOfMemory. Compare-and-swap,
  // so concurrent allocations can never overshoot the capacity together.
  void reserve(size_t bytes) {
    size_t in_use = in_use_.load();
    do {
      if (bytes > capacity_ - in_use) {
        throw DeviceOutOfMemory(
            cat("device out of memory: asked for ", format_bytes(bytes), " with ",
                format_bytes(in_use), " of ", format_bytes(capacity_),
                " in use; raise device.memory_gb or lower zero_optimization.sub_group_size / "
                "offload more"));
      }
    } while (!in_use_.compare_exchange_weak(in_use, in_use + bytes));
  }

  CpuStream& own(Stream& stream) const {
    auto* cpu = dynamic_cast<CpuStream*>(&stream);
    TANDEM_CHECK(cpu != nullptr && cpu->owner() == this, "stream '", stream.name(),
                 "' was not created by this cpu device");
    return *cpu;
  }
  CpuEvent& own(Event& event) const {
    auto* cpu = dynamic_cast<CpuEvent*>(&event);
    TANDEM_CHECK(cpu != nullptr && cpu->owner() == this,
                 "event was not created by this cpu device");
    return *cpu;
  }

  const size_t capacity_;
  const int64_t fail_copy_number_;
  const std::string slow_stream_;
  const double slow_copy_ms_;
  TraceRecorder* tracer_ = nullptr;
  std::atomic<size_t> in_use_{0};
  std::atomic<int64_t> next_copy_number_{0};
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

void launch_host_task(Stream& stream, std::function<void()> task) {
  auto* cpu = dynamic_cast<CpuStream*>(&stream);
  TANDEM_CHECK(cpu != nullptr, "launch_host_task: stream '", stream.name(),
               "' is not a cpu device stream");
  cpu->enqueue("host task", std::move(task));
}

}  // namespace tandem
