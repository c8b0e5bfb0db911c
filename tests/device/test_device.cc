// The device layer on the CPU backend: memory accounting, copies between spaces, stream
// order, cross-stream events, failure propagation and the asynchronous AdamW.
//
// Ordering conditions are created with gates (host tasks that block a stream until the
// test opens them) and large copies, never with sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <numeric>
#include <vector>

#include "support/test_util.h"
#include "tandem/bench/device_bench.h"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/device/cpu/cpu_device.h"
#include "tandem/device/device.h"
#include "tandem/optim/adamw/adamw_device_kernel.h"

namespace tandem {
namespace {

using ::tandem::testing::error_of;

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

// Blocks a stream until open() (or destruction, so a failing test cannot hang the
// streams' destructors: declare the gate after the streams it blocks).
class Gate {
 public:
  explicit Gate(Stream& stream) {
    launch_host_task(stream, [future = opened_.get_future().share()] { future.wait(); });
  }
  ~Gate() { open(); }
  void open() {
    if (!is_open_) opened_.set_value();
    is_open_ = true;
  }

 private:
  std::promise<void> opened_;
  bool is_open_ = false;
};

void fill(const DeviceAllocation& a, uint8_t seed) {
  auto* p = a.as<uint8_t>();
  for (size_t i = 0; i < a.bytes(); i++) p[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
}
bool same(const DeviceAllocation& a, const DeviceAllocation& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

TEST(Device, MemorySpaceNames) {
  EXPECT_EQ(memory_space_name(MemorySpace::kDevice), "device");
  EXPECT_EQ(memory_space_name(MemorySpace::kPinnedHost), "pinned_host");
  EXPECT_EQ(memory_space_name(MemorySpace::kHost), "host");
}

TEST(Device, DeviceMemoryIsAccountedAgainstTheCapacity) {
  auto device = make_cpu_device({.memory_bytes = kMiB});
  EXPECT_EQ(device->device_capacity(), kMiB);
  EXPECT_EQ(device->device_in_use(), 0u);

  DeviceAllocation a = device->allocate(MemorySpace::kDevice, 768 * kKiB);
  EXPECT_EQ(a.bytes(), 768 * kKiB);
  EXPECT_EQ(a.space(), MemorySpace::kDevice);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  EXPECT_EQ(device->device_in_use(), 768 * kKiB);
  EXPECT_EQ(device->device_free(), 256 * kKiB);

  // Host spaces do not count against the arena, however large.
  DeviceAllocation pinned = device->allocate(MemorySpace::kPinnedHost, 4 * kMiB);
  DeviceAllocation host = device->allocate(MemorySpace::kHost, 4 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(host.data()) % 64, 0u);
  EXPECT_EQ(device->device_in_use(), 768 * kKiB);

  // Exactly the rest fits; one byte more does not.
  DeviceAllocation rest = device->allocate(MemorySpace::kDevice, 256 * kKiB);
  EXPECT_EQ(device->device_free(), 0u);
  EXPECT_THROW(device->allocate(MemorySpace::kDevice, 1), DeviceOutOfMemory);
  rest.reset();
  EXPECT_EQ(rest.data(), nullptr);
  EXPECT_EQ(device->device_in_use(), 768 * kKiB);

  std::string message;
  try {
    device->allocate(MemorySpace::kDevice, 1536 * kKiB);
  } catch (const DeviceOutOfMemory& e) {
    message = e.what();
  }
  EXPECT_CONTAINS(message, "device out of memory");
  EXPECT_CONTAINS(message, "asked for 1.50 MiB with 768.00 KiB of 1.00 MiB in use");
  EXPECT_CONTAINS(message, "device.memory_gb");
  // A failed allocation takes nothing.
  EXPECT_EQ(device->device_in_use(), 768 * kKiB);

  // Moving transfers ownership; the moved-from allocation releases nothing.
  DeviceAllocation moved = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(device->device_in_use(), 768 * kKiB);
  // Move-assigning releases what the target held.
  DeviceAllocation small = device->allocate(MemorySpace::kDevice, kKiB);
  EXPECT_EQ(device->device_in_use(), 769 * kKiB);
  small = std::move(moved);
  EXPECT_EQ(device->device_in_use(), 768 * kKiB);
  EXPECT_EQ(small.bytes(), 768 * kKiB);
  { DeviceAllocation scoped = std::move(small); }
  EXPECT_EQ(device->device_in_use(), 0u);
  EXPECT_NO_THROW(device->allocate(MemorySpace::kDevice, kMiB));
}

TEST(Device, CopiesRoundTripBetweenAllSpaces) {
  auto device = make_cpu_device({});
  const MemorySpace spaces[] = {MemorySpace::kDevice, MemorySpace::kPinnedHost, MemorySpace::kHost};
  const size_t bytes = 100 * kKiB + 3;
  auto stream = device->create_stream("copy");
  uint8_t seed = 1;
  for (MemorySpace from : spaces) {
    for (MemorySpace to : spaces) {
      SCOPED_TRACE(cat(memory_space_name(from), " -> ", memory_space_name(to)));
      DeviceAllocation src = device->allocate(from, bytes);
      DeviceAllocation dst = device->allocate(to, bytes);
      DeviceAllocation back = device->allocate(from, bytes);
      fill(src, seed++);
      std::memset(dst.data(), 0, bytes);
      std::memset(back.data(), 0, bytes);
      device->copy_async(dst.data(), src.data(), bytes, *stream);
      device->copy_async(back.data(), dst.data(), bytes, *stream);
      stream->synchronize();
      EXPECT_TRUE(same(src, dst));
      EXPECT_TRUE(same(src, back));
    }
  }
  EXPECT_EQ(device->device_in_use(), 0u);
}

TEST(Device, OverlappingCopyIsRejected) {
  auto device = make_cpu_device({});
  DeviceAllocation a = device->allocate(MemorySpace::kHost, kKiB);
  auto stream = device->create_stream("copy");
  EXPECT_CONTAINS(error_of([&] { device->copy_async(a.as<uint8_t>() + 1, a.data(), 16, *stream); }),
                  "overlap");
}

TEST(Device, StreamRunsTasksInOrder) {
  auto device = make_cpu_device({});
  // A chain of copies: the last buffer holds the first's bytes only if every copy ran
  // after the one before it. The stream is gated so that everything is queued first.
  constexpr int kLinks = 64;
  std::vector<DeviceAllocation> buffers;
  for (int i = 0; i <= kLinks; i++) {
    buffers.push_back(device->allocate(MemorySpace::kDevice, 256 * kKiB));
    std::memset(buffers.back().data(), 0, buffers.back().bytes());
  }
  fill(buffers[0], 42);
  std::vector<int> order;
  auto stream = device->create_stream("fifo");
  {
    Gate gate(*stream);
    for (int i = 0; i < kLinks; i++) {
      device->copy_async(buffers[i + 1].data(), buffers[i].data(), buffers[i].bytes(), *stream);
      launch_host_task(*stream, [&order, i] { order.push_back(i); });
    }
  }
  stream->synchronize();
  EXPECT_TRUE(same(buffers[0], buffers[kLinks]));
  std::vector<int> expected(kLinks);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST(Device, SynchronizeWaitsForEverythingQueuedBefore) {
  auto device = make_cpu_device({});
  std::atomic<int> done = 0;
  auto stream = device->create_stream("s");
  for (int i = 0; i < 1000; i++) launch_host_task(*stream, [&done] { done++; });
  stream->synchronize();
  EXPECT_EQ(done.load(), 1000);
}

TEST(Device, WaitOrdersAcrossStreamsWithAGate) {
  auto device = make_cpu_device({});
  DeviceAllocation a = device->allocate(MemorySpace::kPinnedHost, kMiB);
  DeviceAllocation b = device->allocate(MemorySpace::kDevice, kMiB);
  DeviceAllocation c = device->allocate(MemorySpace::kPinnedHost, kMiB);
  fill(a, 3);
  std::memset(b.data(), 0, kMiB);
  std::memset(c.data(), 0, kMiB);
  auto producer = device->create_stream("producer");
  auto consumer = device->create_stream("consumer");
  auto produced = device->create_event();
  auto consumed = device->create_event();

  Gate gate(*producer);
  device->copy_async(b.data(), a.data(), kMiB, *producer);
  device->record(*produced, *producer);
  device->wait(*consumer, *produced);
  device->copy_async(c.data(), b.data(), kMiB, *consumer);
  device->record(*consumed, *consumer);

  // The consumer cannot get past the wait while the producer is gated.
  EXPECT_FALSE(produced->ready());
  EXPECT_FALSE(consumed->ready());
  gate.open();
  consumed->synchronize();
  EXPECT_TRUE(produced->ready());
  EXPECT_TRUE(consumed->ready());
  EXPECT_TRUE(same(a, c));
}

TEST(Device, WaitOrdersAcrossStreamsBehindALargeCopy) {
  auto device = make_cpu_device({.memory_bytes = 64 * kMiB});
  const size_t large = 32 * kMiB;
  DeviceAllocation slow_src = device->allocate(MemorySpace::kPinnedHost, large);
  DeviceAllocation slow_dst = device->allocate(MemorySpace::kDevice, large);
  DeviceAllocation a = device->allocate(MemorySpace::kPinnedHost, kMiB);
  DeviceAllocation b = device->allocate(MemorySpace::kDevice, kMiB);
  DeviceAllocation c = device->allocate(MemorySpace::kPinnedHost, kMiB);
  fill(slow_src, 1);
  std::memset(slow_dst.data(), 0, large);  // first touch now, so the copy is only a copy
  fill(a, 9);
  std::memset(b.data(), 0, kMiB);
  std::memset(c.data(), 0, kMiB);
  auto h2d = device->create_stream("h2d");
  auto d2h = device->create_stream("d2h");
  auto event = device->create_event();
  // h2d writes b only after a copy that takes milliseconds: without the wait, d2h would
  // read b (still zeros) long before then.
  device->copy_async(slow_dst.data(), slow_src.data(), large, *h2d);
  device->copy_async(b.data(), a.data(), kMiB, *h2d);
  device->record(*event, *h2d);
  device->wait(*d2h, *event);
  device->copy_async(c.data(), b.data(), kMiB, *d2h);
  d2h->synchronize();
  EXPECT_TRUE(same(a, c));
  EXPECT_TRUE(same(slow_src, slow_dst));
}

TEST(Device, EventsThatWereNeverRecordedAreReady) {
  auto device = make_cpu_device({});
  std::atomic<bool> ran = false;
  auto stream = device->create_stream("s");
  auto other = device->create_stream("other");
  auto event = device->create_event();
  EXPECT_TRUE(event->ready());
  EXPECT_NO_THROW(event->synchronize());
  // A wait on a never-recorded event is a no-op: the stream is not blocked by it.
  device->wait(*other, *event);
  launch_host_task(*other, [&ran] { ran = true; });
  other->synchronize();
  EXPECT_TRUE(ran.load());
}

TEST(Device, ReRecordingStartsANewGeneration) {
  auto device = make_cpu_device({});
  std::atomic<bool> waiter_ran = false;
  auto slow = device->create_stream("slow");
  auto fast = device->create_stream("fast");
  auto waiter = device->create_stream("waiter");
  auto event = device->create_event();
  auto waiter_done = device->create_event();
  {
    Gate gate(*slow);
    device->record(*event, *slow);
    EXPECT_FALSE(event->ready());
    // This wait captures the first generation, on the gated stream.
    device->wait(*waiter, *event);
    launch_host_task(*waiter, [&waiter_ran] { waiter_ran = true; });
    device->record(*waiter_done, *waiter);

    // The second generation is on a free stream: synchronize and ready refer to it.
    device->record(*event, *fast);
    event->synchronize();
    EXPECT_TRUE(event->ready());
    // ...but the earlier wait still refers to the first one.
    fast->synchronize();
    EXPECT_FALSE(waiter_done->ready());
    EXPECT_FALSE(waiter_ran.load());

    // A third generation back on the gated stream is not reached.
    device->record(*event, *slow);
    EXPECT_FALSE(event->ready());
    gate.open();
    event->synchronize();
    waiter_done->synchronize();
  }
  EXPECT_TRUE(waiter_ran.load());
}

TEST(Device, CopiesAreNumberedAcrossStreams) {
  auto device = make_cpu_device({.fail_copy_number = 2});
  // Separate destinations: the two streams run concurrently.
  std::vector<uint8_t> src(64, 1), dst_a(64, 0), dst_b(64, 0), dst_failed(64, 0);
  auto a = device->create_stream("a");
  auto b = device->create_stream("b");
  device->copy_async(dst_a.data(), src.data(), 64, *a);  // #0
  device->copy_async(dst_b.data(), src.data(), 64, *b);  // #1
  b->synchronize();
  a->synchronize();
  device->copy_async(dst_failed.data(), src.data(), 64, *b);  // #2 fails
  EXPECT_NO_THROW(a->synchronize());
  const std::string message = error_of([&] { b->synchronize(); });
  EXPECT_CONTAINS(message, "stream 'b': copy failed: injected copy failure (copy #2)");
  EXPECT_EQ(dst_a, src);
  EXPECT_EQ(dst_b, src);
  EXPECT_EQ(dst_failed, std::vector<uint8_t>(64, 0));
}

TEST(Device, InjectedCopyFailurePropagates) {
  auto device = make_cpu_device({.fail_copy_number = 1});
  const size_t bytes = 64 * kKiB;
  DeviceAllocation src = device->allocate(MemorySpace::kPinnedHost, bytes);
  DeviceAllocation ok = device->allocate(MemorySpace::kDevice, bytes);
  DeviceAllocation failed = device->allocate(MemorySpace::kDevice, bytes);
  DeviceAllocation skipped = device->allocate(MemorySpace::kDevice, bytes);
  DeviceAllocation downstream = device->allocate(MemorySpace::kDevice, bytes);
  fill(src, 5);
  for (auto* a : {&ok, &failed, &skipped, &downstream}) std::memset(a->data(), 0xee, bytes);
  std::vector<uint8_t> untouched(bytes, 0xee);
  std::atomic<int> host_tasks_run = 0;
  auto h2d = device->create_stream("h2d");
  auto compute = device->create_stream("compute");
  auto before = device->create_event();
  auto after = device->create_event();

  {
    Gate gate(*h2d);  // everything below is queued before any of it runs
    device->copy_async(ok.data(), src.data(), bytes, *h2d);  // copy #0
    device->record(*before, *h2d);
    device->copy_async(failed.data(), src.data(), bytes, *h2d);   // copy #1: injected failure
    device->copy_async(skipped.data(), src.data(), bytes, *h2d);  // skipped
    launch_host_task(*h2d, [&] { host_tasks_run++; });            // skipped
    device->record(*after, *h2d);
    device->wait(*compute, *after);
    device->copy_async(downstream.data(), src.data(), bytes, *compute);  // skipped
    launch_host_task(*compute, [&] { host_tasks_run++; });               // skipped
  }

  const std::string message = error_of([&] { h2d->synchronize(); });
  EXPECT_CONTAINS(message, "stream 'h2d'");
  EXPECT_CONTAINS(message, "injected copy failure (copy #1)");
  // Sticky: the stream keeps reporting it.
  EXPECT_CONTAINS(error_of([&] { h2d->synchronize(); }), "injected");

  EXPECT_TRUE(same(src, ok));
  EXPECT_EQ(std::memcmp(failed.data(), untouched.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(skipped.data(), untouched.data(), bytes), 0);

  // The event before the failure is clean; the one after carries it.
  EXPECT_TRUE(before->ready());
  EXPECT_NO_THROW(before->synchronize());
  EXPECT_TRUE(after->ready());
  EXPECT_CONTAINS(error_of([&] { after->synchronize(); }), "stream 'h2d': copy failed: injected");

  // The stream that waited on it fails too, naming both streams, and ran nothing after.
  const std::string downstream_message = error_of([&] { compute->synchronize(); });
  EXPECT_CONTAINS(downstream_message, "stream 'compute'");
  EXPECT_CONTAINS(downstream_message, "stream 'h2d'");
  EXPECT_CONTAINS(downstream_message, "injected");
  EXPECT_EQ(std::memcmp(downstream.data(), untouched.data(), bytes), 0);
  EXPECT_EQ(host_tasks_run.load(), 0);

  // Work queued after the failure is refused too; later copies are numbered on.
  device->copy_async(skipped.data(), src.data(), bytes, *h2d);
  EXPECT_THROW(h2d->synchronize(), Error);
  EXPECT_EQ(std::memcmp(skipped.data(), untouched.data(), bytes), 0);
}

TEST(Device, ThrowingHostTaskFailsTheStream) {
  auto device = make_cpu_device({});
  auto stream = device->create_stream("host");
  launch_host_task(*stream, [] { fail("boom"); });
  EXPECT_CONTAINS(error_of([&] { stream->synchronize(); }),
                  "stream 'host': host task failed: boom");
}

TEST(Device, AdamWIsBitIdenticalToTheReference) {
  auto device = make_cpu_device({});
  const size_t n = 10007;  // not a multiple of any vector width: the tail runs too
  auto stream = device->create_stream("optimizer");
  Rng rng(1234);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 grads, bf16 working copy" : "fp32 grads");
    std::vector<float> params(n), m(n), v(n), grads(n);
    std::vector<uint16_t> grads16(n), params16(n, 0);
    for (size_t i = 0; i < n; i++) {
      params[i] = rng.normal();
      m[i] = rng.normal() * 1e-2f;
      v[i] = rng.uniform() * 1e-3f;
      grads[i] = rng.normal();
      grads16[i] = float_to_bf16(rng.normal());
    }
    // Device copies of the state, updated asynchronously.
    auto to_device = [&](const void* data, size_t bytes) {
      DeviceAllocation a = device->allocate(MemorySpace::kDevice, bytes);
      std::memcpy(a.data(), data, bytes);
      return a;
    };
    DeviceAllocation d_params = to_device(params.data(), n * 4);
    DeviceAllocation d_m = to_device(m.data(), n * 4);
    DeviceAllocation d_v = to_device(v.data(), n * 4);
    DeviceAllocation d_grads =
        bf16 ? to_device(grads16.data(), n * 2) : to_device(grads.data(), n * 4);
    DeviceAllocation d_params16 = to_device(params16.data(), n * 2);

    AdamWArrays host{.params = params.data(), .m = m.data(), .v = v.data()};
    AdamWArrays dev{.params = d_params.as<float>(), .m = d_m.as<float>(), .v = d_v.as<float>()};
    if (bf16) {
      host.grads = grads16.data();
      dev.grads = d_grads.data();
      host.grad_dtype = dev.grad_dtype = GradDType::kBF16;
      host.params16 = params16.data();
      dev.params16 = d_params16.data();
      host.params16_dtype = dev.params16_dtype = WorkingDType::kBF16;
    } else {
      host.grads = grads.data();
      dev.grads = d_grads.data();
    }
    const AdamWHyper hyper{.lr = 3e-3f, .weight_decay = 0.1f};
    for (int64_t step = 1; step <= 3; step++) {
      const AdamWStepScalars scalars = adamw_step_scalars(hyper, step, true, 0.5f);
      adamw_reference(host, n, scalars);
      device->launch_async(adamw_device_kernel(dev, n, scalars), *stream);
    }
    // Then segments in one call: with and without decay, [n/2, n/2 + 5) left alone.
    const std::vector<UpdateSegment> segments{
        {0, 3, true}, {3, n / 2, false}, {n / 2 + 5, n - 1, true}, {n - 1, n, false}};
    const AdamWStepScalars decay = adamw_step_scalars(hyper, 4, true, 1.0f);
    const AdamWStepScalars no_decay = adamw_step_scalars(hyper, 4, false, 1.0f);
    for (const UpdateSegment& seg : segments)
      adamw_reference(host.slice(seg.begin), seg.end - seg.begin,
                      seg.weight_decay ? decay : no_decay);
    device->launch_async(adamw_device_kernel(dev, segments, decay, no_decay), *stream);
    stream->synchronize();
    EXPECT_EQ(std::memcmp(d_params.data(), params.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(d_m.data(), m.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(d_v.data(), v.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(d_params16.data(), params16.data(), n * 2), 0);
  }
}

// Any NaN equals any NaN: the payload an fma carries depends on the instruction's operand
// order, which the reference and the SIMD kernels do not share (test_adamw_simd.cc).
bool same_bits_or_both_nan(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

// The semantics every device shares (the cuda device's test is test_cuda_device.cc): one
// call over many segments with mixed decay and a gap, arrays starting 0..3 floats past a
// 16-byte boundary, odd lengths, nasty values (zeros, denormals, huge, NaN and infinite
// gradients), every gradient and working-copy dtype: the reference's bits per segment.
TEST(Device, AdamWOverSegmentsFromMisalignedStartsIsBitIdenticalToTheReference) {
  auto device = make_cpu_device({});
  auto stream = device->create_stream("optimizer");
  const size_t n = 4099;
  Rng lengths(42);
  std::vector<UpdateSegment> segments;
  for (size_t begin = 0; begin < n;) {
    const size_t end = std::min(n, begin + 1 + lengths.next_u64() % 300);
    if (!(begin >= 700 && end <= 1000)) segments.push_back({begin, end, segments.size() % 3 != 1});
    begin = end;
  }
  const AdamWHyper hyper{
      .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  const AdamWStepScalars decay = adamw_step_scalars(hyper, 5, true, 0.75f);
  const AdamWStepScalars no_decay = adamw_step_scalars(hyper, 5, false, 0.75f);
  for (GradDType g : {GradDType::kF32, GradDType::kBF16}) {
    for (WorkingDType w : {WorkingDType::kNone, WorkingDType::kBF16, WorkingDType::kF16}) {
      for (size_t offset : {0, 1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << "grads " << static_cast<int>(g) << " working "
                                          << static_cast<int>(w) << " offset " << offset);
        const size_t total = n + 4;
        Rng rng(7 + offset);
        std::vector<float> p(total), m(total), v(total), grads(total);
        std::vector<uint16_t> grads16(total), p16(total, 0);
        for (size_t i = 0; i < total; i++) {
          p[i] = testing::nasty_value(rng, false);
          m[i] = testing::nasty_value(rng, false) * 1e-3f;
          v[i] = std::fabs(testing::nasty_value(rng, false)) * 1e-6f;
          grads[i] = testing::nasty_value(rng, true);
          grads16[i] = float_to_bf16(testing::nasty_value(rng, true));
        }
        // The device's copies (16-byte aligned allocations, then `offset` elements in).
        auto to_device = [&](const auto& host) {
          const size_t bytes = host.size() * sizeof(host[0]);
          DeviceAllocation a = device->allocate(MemorySpace::kDevice, bytes);
          std::memcpy(a.data(), host.data(), bytes);
          return a;
        };
        DeviceAllocation dp = to_device(p), dm = to_device(m), dv = to_device(v),
                         dg = to_device(grads), dg16 = to_device(grads16), dp16 = to_device(p16);
        const bool f32 = g == GradDType::kF32;
        const bool working = w != WorkingDType::kNone;
        AdamWArrays host{.params = p.data() + offset,
                         .m = m.data() + offset,
                         .v = v.data() + offset,
                         .grads = f32 ? static_cast<const void*>(grads.data() + offset)
                                      : grads16.data() + offset,
                         .grad_dtype = g,
                         .params16 = working ? p16.data() + offset : nullptr,
                         .params16_dtype = w};
        AdamWArrays dev{.params = dp.as<float>() + offset,
                        .m = dm.as<float>() + offset,
                        .v = dv.as<float>() + offset,
                        .grads = f32 ? static_cast<const void*>(dg.as<float>() + offset)
                                     : dg16.as<uint16_t>() + offset,
                        .grad_dtype = g,
                        .params16 = working ? dp16.as<uint16_t>() + offset : nullptr,
                        .params16_dtype = w};
        for (const UpdateSegment& seg : segments)
          adamw_reference(host.slice(seg.begin), seg.end - seg.begin,
                          seg.weight_decay ? decay : no_decay);
        device->launch_async(adamw_device_kernel(dev, segments, decay, no_decay), *stream);
        stream->synchronize();
        for (size_t i = 0; i < total; i++) {
          ASSERT_TRUE(same_bits_or_both_nan(dp.as<float>()[i], p[i])) << "params[" << i << "]";
          ASSERT_TRUE(same_bits_or_both_nan(dm.as<float>()[i], m[i])) << "m[" << i << "]";
          ASSERT_TRUE(same_bits_or_both_nan(dv.as<float>()[i], v[i])) << "v[" << i << "]";
          const uint16_t got16 = dp16.as<uint16_t>()[i];
          const bool both_nan =
              w == WorkingDType::kBF16
                  ? std::isnan(bf16_to_float(got16)) && std::isnan(bf16_to_float(p16[i]))
                  : std::isnan(fp16_to_float(got16)) && std::isnan(fp16_to_float(p16[i]));
          ASSERT_TRUE(got16 == p16[i] || (working && both_nan)) << "params16[" << i << "]";
        }
      }
    }
  }
}

TEST(Device, DestroyingStreamsWithQueuedWorkDrainsThem) {
  auto device = make_cpu_device({.memory_bytes = 64 * kMiB, .fail_copy_number = 70});
  DeviceAllocation src = device->allocate(MemorySpace::kPinnedHost, kMiB);
  DeviceAllocation dst = device->allocate(MemorySpace::kDevice, kMiB);
  fill(src, 11);
  std::memset(dst.data(), 0, kMiB);
  std::atomic<int> ran = 0;
  auto healthy_done = device->create_event();
  {
    auto healthy = device->create_stream("healthy");
    auto failing = device->create_stream("failing");
    auto waiting = device->create_stream("waiting");
    auto event = device->create_event();
    for (int i = 0; i < 50; i++) device->copy_async(dst.data(), src.data(), kMiB, *healthy);
    launch_host_task(*healthy, [&ran] { ran++; });
    device->record(*event, *healthy);
    device->record(*healthy_done, *healthy);
    // A stream whose queue fails part way, and one waiting on it: both still drain.
    device->wait(*failing, *event);
    for (int i = 0; i < 40; i++) device->copy_async(dst.data(), src.data(), kMiB, *failing);
    device->record(*event, *failing);
    device->wait(*waiting, *event);
    launch_host_task(*waiting, [&ran] { ran += 100; });
    // The event is destroyed before the streams that still reference its markers.
  }
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(same(src, dst));
  EXPECT_TRUE(healthy_done->ready());
  EXPECT_NO_THROW(healthy_done->synchronize());
}

// The device benchmarks run on any backend; on the CPU device they measure memcpy and
// the CPU kernel, which checks their bookkeeping (not GPU speed).
TEST(DeviceBench, PcieAndAdamWReportConsistentFigures) {
  auto device = make_cpu_device({.memory_bytes = 64 << 20});
  const PcieBenchResult pcie = run_pcie_bench(*device, 4 << 20, 2);
  EXPECT_GT(pcie.h2d_gb_per_s, 0.0);
  EXPECT_GT(pcie.d2h_gb_per_s, 0.0);
  EXPECT_GT(pcie.both_gb_per_s, 0.0);
  const DeviceAdamWBenchResult adamw = run_device_adamw_bench(*device, 1 << 20, 2);
  EXPECT_EQ(adamw.bytes_per_param, 30.0);
  EXPECT_NEAR(adamw.gb_per_s, adamw.params_per_s * 30 / 1e9, 1e-9 * adamw.gb_per_s);
  EXPECT_NEAR(adamw.ratio, adamw.gb_per_s / adamw.copy_gb_per_s, 1e-12);
  EXPECT_EQ(device->device_in_use(), 0u);  // everything released
}

}  // namespace
}  // namespace tandem
