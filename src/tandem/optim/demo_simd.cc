// combine_rows for each target. As in adamw_simd.cc, the functions carry target attributes
// instead of the file being compiled with -mavx2, so no AVX instruction reaches a CPU
// without it.
#include "tandem/optim/demo_simd.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "tandem/core/error.h"

namespace tandem {
namespace {

#define TANDEM_AVX2 __attribute__((target("avx2,fma")))
#define TANDEM_AVX512 __attribute__((target("avx2,fma,avx512f")))

void combine_scalar(float* out, const float* coeffs, size_t coeff_stride, const float* rows,
                    size_t row_stride, size_t m, size_t first, size_t n) {
  for (size_t i = first; i < n; i++) out[i] = 0.0f;
  for (size_t j = 0; j < m; j++) {
    const float c = coeffs[j * coeff_stride];
    if (c == 0.0f) continue;
    const float* row = rows + j * row_stride;
    for (size_t i = first; i < n; i++) out[i] = std::fma(c, row[i], out[i]);
  }
}

TANDEM_AVX2 void combine_avx2(float* out, const float* coeffs, size_t coeff_stride,
                              const float* rows, size_t row_stride, size_t m, size_t n) {
  size_t i = 0;
  // 32 outputs at a time (four accumulators), then 8, then the scalar tail.
  for (; i + 32 <= n; i += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t j = 0; j < m; j++) {
      const float c = coeffs[j * coeff_stride];
      if (c == 0.0f) continue;
      const __m256 cv = _mm256_set1_ps(c);
      const float* row = rows + j * row_stride + i;
      a0 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row), a0);
      a1 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row + 8), a1);
      a2 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row + 16), a2);
      a3 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row + 24), a3);
    }
    _mm256_storeu_ps(out + i, a0);
    _mm256_storeu_ps(out + i + 8, a1);
    _mm256_storeu_ps(out + i + 16, a2);
    _mm256_storeu_ps(out + i + 24, a3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_setzero_ps();
    for (size_t j = 0; j < m; j++) {
      const float c = coeffs[j * coeff_stride];
      if (c == 0.0f) continue;
      a = _mm256_fmadd_ps(_mm256_set1_ps(c), _mm256_loadu_ps(rows + j * row_stride + i), a);
    }
    _mm256_storeu_ps(out + i, a);
  }
  combine_scalar(out, coeffs, coeff_stride, rows, row_stride, m, i, n);
}

TANDEM_AVX512 void combine_avx512(float* out, const float* coeffs, size_t coeff_stride,
                                  const float* rows, size_t row_stride, size_t m, size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t j = 0; j < m; j++) {
      const float c = coeffs[j * coeff_stride];
      if (c == 0.0f) continue;
      const __m512 cv = _mm512_set1_ps(c);
      const float* row = rows + j * row_stride + i;
      a0 = _mm512_fmadd_ps(cv, _mm512_loadu_ps(row), a0);
      a1 = _mm512_fmadd_ps(cv, _mm512_loadu_ps(row + 16), a1);
      a2 = _mm512_fmadd_ps(cv, _mm512_loadu_ps(row + 32), a2);
      a3 = _mm512_fmadd_ps(cv, _mm512_loadu_ps(row + 48), a3);
    }
    _mm512_storeu_ps(out + i, a0);
    _mm512_storeu_ps(out + i + 16, a1);
    _mm512_storeu_ps(out + i + 32, a2);
    _mm512_storeu_ps(out + i + 48, a3);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 a = _mm512_setzero_ps();
    for (size_t j = 0; j < m; j++) {
      const float c = coeffs[j * coeff_stride];
      if (c == 0.0f) continue;
      a = _mm512_fmadd_ps(_mm512_set1_ps(c), _mm512_loadu_ps(rows + j * row_stride + i), a);
    }
    _mm512_storeu_ps(out + i, a);
  }
  combine_avx2(out + i, coeffs, coeff_stride, rows + i, row_stride, m, n - i);
}

}  // namespace

void combine_rows(SimdTarget target, float* out, const float* coeffs, size_t coeff_stride,
                  const float* rows, size_t row_stride, size_t m, size_t n) {
  switch (target) {
    case SimdTarget::kAvx512:
      combine_avx512(out, coeffs, coeff_stride, rows, row_stride, m, n);
      return;
    case SimdTarget::kAvx2:
      combine_avx2(out, coeffs, coeff_stride, rows, row_stride, m, n);
      return;
    case SimdTarget::kScalar:
      combine_scalar(out, coeffs, coeff_stride, rows, row_stride, m, 0, n);
      return;
  }
  fail("combine_rows: unknown SIMD target");
}

}  // namespace tandem
