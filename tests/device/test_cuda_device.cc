// The `cuda` device backend on a GPU (skipped, with the reason printed, where there is
// none): the CUDA AdamW kernel is bit-identical to the scalar reference for every
// gradient and working-copy dtype on nasty data, also over many segments in one launch
// from misaligned starts; copies between every pair of memory
// spaces round-trip; events order streams; the capacity is enforced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/gpu_test.h"
#include "support/test_util.h"
#include "tandem/core/half.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/optim/adamw/adamw_cuda.h"
#include "tandem/optim/adamw/adamw_device_kernel.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {
namespace {

using CudaDeviceTest = testing::GpuTest;

// Bit for bit, except that any NaN equals any NaN: an invalid operation gives the GPU's
// canonical NaN (0x7fffffff) but x86's default NaN (0xffc00000), and which operand's
// payload an fma passes on differs too.
bool same_float(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (a != a && b != b);
}

// The 16-bit working copy: the same bits, or both NaN (a NaN's payload is the payload of
// the float it rounds, which the GPU and the CPU need not agree on: see same_float).
bool same_working(WorkingDType w, uint16_t a, uint16_t b) {
  const auto widen = [w](uint16_t x) {
    return w == WorkingDType::kF16 ? fp16_to_float(x) : bf16_to_float(x);
  };
  return a == b || (std::isnan(widen(a)) && std::isnan(widen(b)));
}

TEST_F(CudaDeviceTest, AdamWKernelIsBitIdenticalToTheReference) {
  const AdamWHyper hyper{
      .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  for (GradDType g : {GradDType::kF32, GradDType::kBF16}) {
    for (WorkingDType w : {WorkingDType::kNone, WorkingDType::kBF16, WorkingDType::kF16}) {
      const size_t n = 100003;
      Rng rng(static_cast<uint64_t>(g) * 10 + static_cast<uint64_t>(w));
      std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), grads(n);
      std::vector<uint16_t> grads16(n), p16(n, 0);
      for (size_t i = 0; i < n; i++) {
        p[i] = testing::nasty_value(rng, false);
        grads[i] = testing::nasty_value(rng, true);
        grads16[i] = float_to_bf16(testing::nasty_value(rng, true));
      }
      DeviceAllocation dp = upload(p), dm = upload(m), dv = upload(v), dg = upload(grads),
                       dg16 = upload(grads16), dp16 = upload(p16);
      AdamWArrays host{
          .params = p.data(),
          .m = m.data(),
          .v = v.data(),
          .grads = g == GradDType::kF32 ? static_cast<const void*>(grads.data()) : grads16.data(),
          .grad_dtype = g,
          .params16 = w == WorkingDType::kNone ? nullptr : p16.data(),
          .params16_dtype = w};
      AdamWArrays dev{.params = dp.as<float>(),
                      .m = dm.as<float>(),
                      .v = dv.as<float>(),
                      .grads = g == GradDType::kF32 ? dg.data() : dg16.data(),
                      .grad_dtype = g,
                      .params16 = w == WorkingDType::kNone ? nullptr : dp16.data(),
                      .params16_dtype = w};
      for (int64_t step = 1; step <= 3; step++) {
        const AdamWStepScalars s =
            adamw_step_scalars(hyper, step, step != 2, step == 2 ? 0.5f : 1.0f);
        adamw_reference(host, n, s);
        device_->launch_async(adamw_device_kernel(dev, n, s), *stream_);
      }
      stream_->synchronize();
      const auto gp = download<float>(dp, n), gm = download<float>(dm, n),
                 gv = download<float>(dv, n);
      const auto gp16 = download<uint16_t>(dp16, n);
      for (size_t i = 0; i < n; i++) {
        ASSERT_TRUE(same_float(gp[i], p[i])) << "params[" << i << "]";
        ASSERT_TRUE(same_float(gm[i], m[i])) << "m[" << i << "]";
        ASSERT_TRUE(same_float(gv[i], v[i])) << "v[" << i << "]";
        if (w != WorkingDType::kNone) {
          const float a =
              w == WorkingDType::kBF16 ? bf16_to_float(gp16[i]) : fp16_to_float(gp16[i]);
          const float b = w == WorkingDType::kBF16 ? bf16_to_float(p16[i]) : fp16_to_float(p16[i]);
          ASSERT_TRUE(same_float(a, b)) << "params16[" << i << "]";
        }
      }
    }
  }
}

// One launch over many segments (mixed decay, a gap left untouched, more segments than
// one launch takes), from starts 0..3 floats past an alignment boundary (the scalar head
// and tail around the 16-byte vector body), and with m one float off the params'
// alignment (no vector body at all): every element as the reference computes it.
TEST_F(CudaDeviceTest, AdamWOverSegmentsInOneLaunchIsBitIdenticalToTheReference) {
  const AdamWHyper hyper{
      .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  const size_t n = 20011;
  // Segments of random lengths, alternating decay, with [700, 750) left out.
  Rng lengths(42);
  std::vector<UpdateSegment> segments;
  for (size_t begin = 0; begin < n;) {
    const size_t end = std::min(n, begin + 1 + lengths.next_u64() % 150);
    if (!(begin >= 700 && end <= 750)) segments.push_back({begin, end, segments.size() % 2 == 0});
    begin = end;
  }
  ASSERT_GT(segments.size(), kAdamWSegmentsPerLaunch);
  for (GradDType g : {GradDType::kF32, GradDType::kBF16}) {
    for (WorkingDType w : {WorkingDType::kNone, WorkingDType::kBF16, WorkingDType::kF16}) {
      for (size_t offset : {0, 1, 2, 3}) {
        for (size_t m_skew : {0, 1}) {
          SCOPED_TRACE(::testing::Message()
                       << "grads " << static_cast<int>(g) << " working " << static_cast<int>(w)
                       << " offset " << offset << " m skew " << m_skew);
          const size_t total = n + 4;
          Rng rng(7 + offset);
          std::vector<float> p(total), m(total + 1), v(total), grads(total);
          std::vector<uint16_t> grads16(total), p16(total, 0);
          for (size_t i = 0; i < total; i++) {
            p[i] = testing::nasty_value(rng, false);
            m[i] = testing::nasty_value(rng, false) * 1e-3f;
            v[i] = std::fabs(testing::nasty_value(rng, false)) * 1e-6f;
            grads[i] = testing::nasty_value(rng, true);
            grads16[i] = float_to_bf16(testing::nasty_value(rng, true));
          }
          DeviceAllocation dp = upload(p), dm = upload(m), dv = upload(v), dg = upload(grads),
                           dg16 = upload(grads16), dp16 = upload(p16);
          const size_t mo = offset + m_skew;
          AdamWArrays host{.params = p.data() + offset,
                           .m = m.data() + mo,
                           .v = v.data() + offset,
                           .grads = g == GradDType::kF32
                                        ? static_cast<const void*>(grads.data() + offset)
                                        : grads16.data() + offset,
                           .grad_dtype = g,
                           .params16 = w == WorkingDType::kNone ? nullptr : p16.data() + offset,
                           .params16_dtype = w};
          AdamWArrays dev{
              .params = dp.as<float>() + offset,
              .m = dm.as<float>() + mo,
              .v = dv.as<float>() + offset,
              .grads = g == GradDType::kF32 ? static_cast<const void*>(dg.as<float>() + offset)
                                            : dg16.as<uint16_t>() + offset,
              .grad_dtype = g,
              .params16 = w == WorkingDType::kNone ? nullptr : dp16.as<uint16_t>() + offset,
              .params16_dtype = w};
          const AdamWStepScalars decay = adamw_step_scalars(hyper, 3, true, 0.75f);
          const AdamWStepScalars no_decay = adamw_step_scalars(hyper, 3, false, 0.75f);
          for (const UpdateSegment& seg : segments)
            adamw_reference(host.slice(seg.begin), seg.end - seg.begin,
                            seg.weight_decay ? decay : no_decay);
          device_->launch_async(adamw_device_kernel(dev, segments, decay, no_decay), *stream_);
          stream_->synchronize();
          const auto gp = download<float>(dp, total), gm = download<float>(dm, total + 1),
                     gv = download<float>(dv, total);
          const auto gp16 = download<uint16_t>(dp16, total);
          for (size_t i = 0; i < total; i++) {
            ASSERT_TRUE(same_float(gp[i], p[i])) << "params[" << i << "]";
            ASSERT_TRUE(same_float(gv[i], v[i])) << "v[" << i << "]";
            ASSERT_TRUE(same_working(w, gp16[i], p16[i])) << "params16[" << i << "]";
          }
          for (size_t i = 0; i < total + 1; i++)
            ASSERT_TRUE(same_float(gm[i], m[i])) << "m[" << i << "]";
        }
      }
    }
  }
}

TEST_F(CudaDeviceTest, CopiesRoundTripThroughEverySpaceAndEventsOrderStreams) {
  const size_t n = 1 << 22;
  std::vector<float> data(n);
  for (size_t i = 0; i < n; i++) data[i] = static_cast<float>(i);
  DeviceAllocation pinned = device_->allocate(MemorySpace::kPinnedHost, n * 4);
  DeviceAllocation a = device_->allocate(MemorySpace::kDevice, n * 4);
  DeviceAllocation b = device_->allocate(MemorySpace::kDevice, n * 4);
  std::memcpy(pinned.data(), data.data(), n * 4);
  auto other = device_->create_stream("other");
  auto event = device_->create_event();
  device_->copy_async(a.data(), pinned.data(), n * 4, *stream_);  // H2D
  device_->record(*event, *stream_);
  device_->wait(*other, *event);
  device_->copy_async(b.data(), a.data(), n * 4, *other);  // D2D, only after the H2D
  std::vector<float> back(n, -1.0f);
  device_->copy_async(back.data(), b.data(), n * 4, *other);  // D2H (pageable)
  other->synchronize();
  EXPECT_EQ(back, data);
}

TEST_F(CudaDeviceTest, CapacityIsEnforcedWithAHelpfulMessage) {
  auto small = make_cuda_device({.memory_bytes = 1 << 20});
  DeviceAllocation fits = small->allocate(MemorySpace::kDevice, 1 << 19);
  const std::string message =
      testing::error_of([&] { small->allocate(MemorySpace::kDevice, 1 << 20); });
  EXPECT_CONTAINS(message, "device out of memory");
  EXPECT_CONTAINS(message, "device.memory_gb");
  fits.reset();
  EXPECT_EQ(small->device_in_use(), 0u);
}

}  // namespace
}  // namespace tandem
