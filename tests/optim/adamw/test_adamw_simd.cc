// The SIMD CPU AdamW is bit-identical to the scalar reference on every instruction set
// this CPU has and every thread count, for fp32 and bf16 gradients and each 16-bit
// working copy; and the 16-bit conversions round to nearest even.
//
// NaN: results are compared bit for bit, except that any NaN equals any NaN (the
// payload a NaN carries through fma depends on the operand order of the instruction
// form, which the IEEE standard leaves open).
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/cpu_features.h"
#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/adamw/adamw_simd.h"
#include "tandem/optim/adamw/cpu_adamw.h"

namespace tandem {
namespace {

bool same_bits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}
bool same_half(uint16_t a, uint16_t b, bool bf16) {
  const bool a_nan = bf16 ? std::isnan(bf16_to_float(a)) : std::isnan(fp16_to_float(a));
  const bool b_nan = bf16 ? std::isnan(bf16_to_float(b)) : std::isnan(fp16_to_float(b));
  return (a_nan && b_nan) || a == b;
}

struct State {
  std::vector<float> params, m, v, grads_f32;
  std::vector<uint16_t> grads_bf16, params16;

  State(size_t n, uint64_t seed)
      : params(n), m(n), v(n), grads_f32(n), grads_bf16(n), params16(n, 0xdead) {
    Rng rng(seed);
    for (size_t i = 0; i < n; i++) params[i] = testing::nasty_value(rng, false);
  }
  void new_gradients(uint64_t seed) {
    Rng rng(seed);
    for (size_t i = 0; i < grads_f32.size(); i++) {
      grads_f32[i] = testing::nasty_value(rng, true);
      grads_bf16[i] = float_to_bf16(testing::nasty_value(rng, true));
    }
  }
  AdamWArrays arrays(GradDType g, WorkingDType w) {
    return {.params = params.data(),
            .m = m.data(),
            .v = v.data(),
            .grads = g == GradDType::kF32 ? static_cast<const void*>(grads_f32.data())
                                          : grads_bf16.data(),
            .grad_dtype = g,
            .params16 = w == WorkingDType::kNone ? nullptr : params16.data(),
            .params16_dtype = w};
  }
};

void expect_same(const State& want, const State& got, WorkingDType w, const std::string& what) {
  for (size_t i = 0; i < want.params.size(); i++) {
    ASSERT_TRUE(same_bits(want.params[i], got.params[i]))
        << what << " params[" << i << "] " << want.params[i] << " vs " << got.params[i];
    ASSERT_TRUE(same_bits(want.m[i], got.m[i])) << what << " m[" << i << "]";
    ASSERT_TRUE(same_bits(want.v[i], got.v[i])) << what << " v[" << i << "]";
    if (w != WorkingDType::kNone) {
      ASSERT_TRUE(same_half(want.params16[i], got.params16[i], w == WorkingDType::kBF16))
          << what << " params16[" << i << "] " << want.params16[i] << " vs " << got.params16[i];
    }
  }
}

const AdamWHyper kHyper{
    .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

class AdamWSimd : public ::testing::TestWithParam<SimdTarget> {};

TEST_P(AdamWSimd, BitIdenticalToReferenceForEveryDtypeLengthAndThreadCount) {
  const SimdTarget target = GetParam();
  if (!cpu_supports(target))
    GTEST_SKIP() << "this CPU lacks " << simd_target_name(target) << "; its kernel cannot run here";
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    CpuAdamW kernel(pool, target);
    for (GradDType g : {GradDType::kF32, GradDType::kBF16}) {
      for (WorkingDType w : {WorkingDType::kNone, WorkingDType::kBF16, WorkingDType::kF16}) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17},
                         size_t{63}, size_t{1000}, size_t{4099}}) {
          State want(n, n + 1), got(n, n + 1);
          // Segments alternating decay and no decay, as a model layout has.
          const std::vector<UpdateSegment> segments = {
              {0, n / 3, true}, {n / 3, n / 2, false}, {n / 2, n, true}};
          for (int64_t step = 1; step <= 3; step++) {
            want.new_gradients(step * 1000 + n);
            got.new_gradients(step * 1000 + n);
            const float clip = step == 2 ? 0.25f : 1.0f;
            const auto decay = adamw_step_scalars(kHyper, step, true, clip);
            const auto no_decay = adamw_step_scalars(kHyper, step, false, clip);
            for (const UpdateSegment& s : segments)
              adamw_reference(want.arrays(g, w).slice(s.begin), s.end - s.begin,
                              s.weight_decay ? decay : no_decay);
            kernel.update(got.arrays(g, w), segments, decay, no_decay);
          }
          expect_same(want, got, w,
                      std::string(simd_target_name(target)) +
                          " threads=" + std::to_string(threads) + " n=" + std::to_string(n));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, AdamWSimd,
                         ::testing::Values(SimdTarget::kScalar, SimdTarget::kAvx2,
                                           SimdTarget::kAvx512),
                         [](const auto& info) {
                           return std::string(simd_target_name(info.param));
                         });

TEST(AdamWSimd, ReportsTheTargetsOfThisCpu) {
  std::string names;
  for (SimdTarget t : supported_simd_targets()) names += std::string(simd_target_name(t)) + " ";
  std::printf("[ INFO     ] SIMD targets on this CPU: %s(best: %s)\n", names.c_str(),
              std::string(simd_target_name(best_simd_target())).c_str());
  EXPECT_TRUE(cpu_supports(SimdTarget::kScalar));
  EXPECT_TRUE(cpu_supports(best_simd_target()));
}

TEST(Half, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // FLT_MAX -> inf
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  // A NaN whose payload lives only in the low 16 bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  // Every bf16 value survives the round trip.
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), h);
    }
  }
}

TEST(Half, Fp16RoundsToNearestEvenEverywhere) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_fp16(f), h) << h;
    }
  }
  // Independent check on random floats: the result is the nearest fp16 (ties to even).
  Rng rng(11);
  for (int i = 0; i < 200000; i++) {
    const float f =
        std::bit_cast<float>(static_cast<uint32_t>(rng.next_u64()) & 0xc7ffffffu);  // |f| < 2^16
    const uint16_t r = float_to_fp16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(fp16_to_float(r)));
      continue;
    }
    if (std::isinf(fp16_to_float(r))) {
      ASSERT_GE(std::fabs(f), 65520.0f) << f;
      continue;
    }
    const double err = std::fabs(static_cast<double>(f) - fp16_to_float(r));
    for (int d : {-1, 1}) {
      const uint16_t neighbour = static_cast<uint16_t>(r + d);
      const float nf = fp16_to_float(neighbour);
      if (std::isnan(nf) || ((neighbour ^ r) & 0x8000)) continue;
      const double nerr = std::fabs(static_cast<double>(f) - nf);
      ASSERT_TRUE(err < nerr || (err == nerr && (r & 1) == 0)) << f << " -> " << r;
    }
  }
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // the tie above 65504 rounds to infinity
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);  // tie between 0 and the smallest subnormal
  EXPECT_EQ(float_to_fp16(0x1.000002p-25f), 0x0001);
}

__attribute__((target("f16c"))) uint16_t hardware_fp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(Half, Fp16MatchesF16cHardwareOnAStrideOfAllFloats) {
  if (!__builtin_cpu_supports("f16c"))
    GTEST_SKIP() << "this CPU has no F16C instructions to compare with";
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 997) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    ASSERT_EQ(float_to_fp16(f), hardware_fp16(f)) << "bits 0x" << std::hex << bits;
  }
}

}  // namespace
}  // namespace tandem
