// A branch-free expf that GCC vectorises, for the GELU and softmax loops.
//
// glibc's expf/tanhf are scalar calls, so a loop that uses them never vectorises; this
// one is plain float and integer arithmetic (no libm, no tables), so `#pragma omp simd`
// or -O3 turns it into SSE2/AVX2/AVX-512 code. The build never contracts a*b+c into an
// FMA (-std=c++20 implies -ffp-contract=off), so every instruction set evaluates the
// same operations in the same order and gives bit-identical results: a kernel built
// with target_clones computes the same floats on any x86-64 machine.
#pragma once

#include <bit>
#include <cstdint>

namespace tandem::cpu {

// Clamps x into [lo, hi] with the compares that maxps/minps implement (a NaN x becomes
// lo, then stays lo).
//
// The bounds must not be compile-time constants inside a loop: GCC would then fold the
// arithmetic that follows the clamp into each arm of it (lo * a is a constant), leaving
// a branch around a float operation that, under the default -ftrapping-math, it will not
// turn back into a select, and the loop stays scalar. So make one with
// opaque_clamp_range() before the loop; the empty asm hides the values from the
// optimizer and costs one load.
struct ClampRange {
  float lo;
  float hi;
  float operator()(float x) const {
    x = x > lo ? x : lo;
    return x < hi ? x : hi;
  }
};

inline ClampRange opaque_clamp_range(float lo, float hi) {
  asm("" : "+m"(lo), "+m"(hi));
  return {lo, hi};
}

// fast_exp's domain; callers clamp its argument into it. At the bottom exp(-86) = 4.5e-38
// is still a normal float (the true value is as good as 0 next to anything it is added
// to); at the top the result overflows to +inf from x = 88.73 on, exactly as expf does.
inline constexpr float kExpMinArg = -86.0f;
inline constexpr float kExpMaxArg = 89.0f;

// exp(x) for x in [kExpMinArg, kExpMaxArg], within ~1 ulp of expf. Cephes' expf: x = k ln2 + r with
// |r| <= ln2/2, exp(r) by a degree-7 polynomial, times 2^k built directly in the exponent bits.
inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  // ln2 split in two (Cody-Waite): kLn2Hi has 9 significant bits, so k * kLn2Hi is
  // exact for |k| <= 128 and r loses nothing to cancellation.
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds x*log2(e) to the nearest integer k (float addition
  // rounds to nearest) and leaves k in the low mantissa bits: bits = 0x4B400000 + k.
  // This avoids roundps, which baseline x86-64 (SSE2) lacks.
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
  const float shifted = x * kLog2e + kRoundMagic;
  const float k = shifted - kRoundMagic;  // in [-124, 128]
  const float r = (x - k * kLn2Hi) - k * kLn2Lo;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float exp_r = p * r2 + r + 1.0f;
  // 2^(k-1) from its biased exponent k - 1 + 127 (a normal float for every k here;
  // unsigned, so the shift has no UB), then times 2: exact, except that it overflows
  // to +inf when exp(x) exceeds FLT_MAX, which 2^k itself (k = 128) could not express.
  const uint32_t biased = std::bit_cast<uint32_t>(shifted) - 0x4B400000u + 126u;
  return exp_r * std::bit_cast<float>(biased << 23) * 2.0f;
}

}  // namespace tandem::cpu
