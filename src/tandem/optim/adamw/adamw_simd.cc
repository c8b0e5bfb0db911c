// AVX2 and AVX-512 AdamW. The functions carry target attributes instead of the file
// being compiled with -mavx2, so no AVX instruction can leak into code that runs on a
// CPU without it (e.g. an inline library function the linker picks from this file).
#include "tandem/optim/adamw/adamw_simd.h"

// GCC 12's AVX-512 headers build "undefined" vectors that -Wmaybe-uninitialized
// reports falsely at every use; nothing in this file reads an uninitialised value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

namespace tandem {
namespace {

#define TANDEM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TANDEM_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl")))

// ---- AVX2: 8 floats per vector ------------------------------------------------------

template <GradDType G>
TANDEM_AVX2 inline __m256 load_grad8(const void* grads, size_t i) {
  if constexpr (G == GradDType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grads) + i);
  } else {
    // bf16 -> fp32 is exact: the 16 bits become the top half of the float.
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grads) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// float_to_bf16 on 8 lanes: round to nearest even on the integer bits; NaN gets the
// quiet bit instead.
TANDEM_AVX2 inline __m128i to_bf16x8(__m256 p) {
  const __m256i bits = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Narrow 8 x 32-bit (each <= 0xffff) to 8 x 16-bit; packus works per 128-bit lane.
  const __m256i packed = _mm256_packus_epi32(result, result);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

template <GradDType G, WorkingDType W>
TANDEM_AVX2 void adamw_avx2_loop(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
  const __m256 beta1 = _mm256_set1_ps(s.beta1), beta2 = _mm256_set1_ps(s.beta2);
  const __m256 one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 neg_step_size = _mm256_set1_ps(-s.step_size);
  const __m256 inv_sqrt_bc2 = _mm256_set1_ps(s.inv_sqrt_bc2), eps = _mm256_set1_ps(s.eps);
  const __m256 decay = _mm256_set1_ps(s.decay_factor), grad_scale = _mm256_set1_ps(s.grad_scale);
  uint16_t* params16 = static_cast<uint16_t*>(a.params16);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_mul_ps(load_grad8<G>(a.grads, i), grad_scale);
    const __m256 m =
        _mm256_fmadd_ps(beta1, _mm256_loadu_ps(a.m + i), _mm256_mul_ps(one_minus_beta1, g));
    const __m256 v = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(a.v + i),
                                     _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), inv_sqrt_bc2, eps);
    const __m256 decayed = _mm256_mul_ps(_mm256_loadu_ps(a.params + i), decay);
    const __m256 p = _mm256_fmadd_ps(neg_step_size, _mm256_div_ps(m, denom), decayed);
    _mm256_storeu_ps(a.params + i, p);
    _mm256_storeu_ps(a.m + i, m);
    _mm256_storeu_ps(a.v + i, v);
    if constexpr (W == WorkingDType::kBF16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(params16 + i), to_bf16x8(p));
    if constexpr (W == WorkingDType::kF16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(params16 + i),
                       _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if (i < n) adamw_reference(a.slice(i), n - i, s);
}

// ---- AVX-512: 16 floats per vector --------------------------------------------------

template <GradDType G>
TANDEM_AVX512 inline __m512 load_grad16(const void* grads, size_t i) {
  if constexpr (G == GradDType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(grads) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grads) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

TANDEM_AVX512 inline __m256i to_bf16x16(__m512 p) {
  const __m512i bits = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
}

template <GradDType G, WorkingDType W>
TANDEM_AVX512 void adamw_avx512_loop(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
  const __m512 beta1 = _mm512_set1_ps(s.beta1), beta2 = _mm512_set1_ps(s.beta2);
  const __m512 one_minus_beta1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 neg_step_size = _mm512_set1_ps(-s.step_size);
  const __m512 inv_sqrt_bc2 = _mm512_set1_ps(s.inv_sqrt_bc2), eps = _mm512_set1_ps(s.eps);
  const __m512 decay = _mm512_set1_ps(s.decay_factor), grad_scale = _mm512_set1_ps(s.grad_scale);
  uint16_t* params16 = static_cast<uint16_t*>(a.params16);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_mul_ps(load_grad16<G>(a.grads, i), grad_scale);
    const __m512 m =
        _mm512_fmadd_ps(beta1, _mm512_loadu_ps(a.m + i), _mm512_mul_ps(one_minus_beta1, g));
    const __m512 v = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(a.v + i),
                                     _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), inv_sqrt_bc2, eps);
    const __m512 decayed = _mm512_mul_ps(_mm512_loadu_ps(a.params + i), decay);
    const __m512 p = _mm512_fmadd_ps(neg_step_size, _mm512_div_ps(m, denom), decayed);
    _mm512_storeu_ps(a.params + i, p);
    _mm512_storeu_ps(a.m + i, m);
    _mm512_storeu_ps(a.v + i, v);
    if constexpr (W == WorkingDType::kBF16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(params16 + i), to_bf16x16(p));
    if constexpr (W == WorkingDType::kF16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(params16 + i),
                          _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if (i < n) adamw_reference(a.slice(i), n - i, s);
}

// Instantiates loop<G, W> for the runtime dtypes.
template <template <GradDType, WorkingDType> class Loop>
void dispatch_dtypes(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
  const bool writes_16_bit = a.params16 != nullptr && (a.params16_dtype == WorkingDType::kBF16 ||
                                                       a.params16_dtype == WorkingDType::kF16);
  const WorkingDType w = writes_16_bit ? a.params16_dtype : WorkingDType::kNone;
  if (a.grad_dtype == GradDType::kF32) {
    if (w == WorkingDType::kNone) return Loop<GradDType::kF32, WorkingDType::kNone>::run(a, n, s);
    if (w == WorkingDType::kBF16) return Loop<GradDType::kF32, WorkingDType::kBF16>::run(a, n, s);
    return Loop<GradDType::kF32, WorkingDType::kF16>::run(a, n, s);
  }
  if (w == WorkingDType::kNone) return Loop<GradDType::kBF16, WorkingDType::kNone>::run(a, n, s);
  if (w == WorkingDType::kBF16) return Loop<GradDType::kBF16, WorkingDType::kBF16>::run(a, n, s);
  return Loop<GradDType::kBF16, WorkingDType::kF16>::run(a, n, s);
}

template <GradDType G, WorkingDType W>
struct Avx2Loop {
  static void run(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
    adamw_avx2_loop<G, W>(a, n, s);
  }
};
template <GradDType G, WorkingDType W>
struct Avx512Loop {
  static void run(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
    adamw_avx512_loop<G, W>(a, n, s);
  }
};

}  // namespace

void adamw_avx2(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
  dispatch_dtypes<Avx2Loop>(a, n, s);
}

void adamw_avx512(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
  dispatch_dtypes<Avx512Loop>(a, n, s);
}

void adamw_kernel(SimdTarget target, const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
  switch (target) {
    case SimdTarget::kAvx512:
      return adamw_avx512(a, n, s);
    case SimdTarget::kAvx2:
      return adamw_avx2(a, n, s);
    case SimdTarget::kScalar:
      return adamw_reference(a, n, s);
  }
}

}  // namespace tandem
