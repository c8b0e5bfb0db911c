// combine_rows for each target. As in adamw_simd.cc, the functions carry target attributes
// instead of the file being compiled with -mavx2, so no AVX instruction reaches a CPU
// without it.
//
// The vector kernels compute tiles of 4 outputs rows x 2 vectors: per j, two loads of
// rows[j] feed up to 8 fmas (one broadcast coefficient per output row; when zeros are
// skipped, a zero coefficient leaves its row's accumulators alone, as the scalar code
// does). 8 independent
// accumulators keep both fma units busy through their latency.
#include "tandem/optim/demo_simd.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "tandem/core/error.h"

namespace tandem {
namespace {

#define TANDEM_AVX2 __attribute__((target("avx2,fma")))
#define TANDEM_AVX512 __attribute__((target("avx2,fma,avx512f")))

inline float coeff_at(const float* coeffs, const CombineLayout& l, size_t r, size_t j) {
  return coeffs[r * l.coeff_row + j * l.coeff_col];
}

// Outputs [r0, r1) x [i0, i1), one element at a time.
void combine_scalar(float* out, const float* coeffs, const float* rows, const CombineLayout& l,
                    bool skip_zeros, size_t r0, size_t r1, size_t m, size_t i0, size_t i1) {
  for (size_t r = r0; r < r1; r++) {
    float* o = out + r * l.out_stride;
    for (size_t i = i0; i < i1; i++) o[i] = 0.0f;
    for (size_t j = 0; j < m; j++) {
      const float c = coeff_at(coeffs, l, r, j);
      if (skip_zeros && c == 0.0f) continue;
      const float* row = rows + j * l.row_stride;
      for (size_t i = i0; i < i1; i++) o[i] = std::fma(c, row[i], o[i]);
    }
  }
}

// The vector kernel of a target: V floats per vector, Load/Store/Fma/Zero/Broadcast.
#define TANDEM_COMBINE_KERNEL(NAME, ATTR, VEC, V, LOAD, STORE, FMA, ZERO, SET1)              \
  template <bool kSkipZeros>                                                                 \
  ATTR void NAME(float* out, const float* coeffs, const float* rows, const CombineLayout& l, \
                 size_t R, size_t m, size_t n, size_t& done_cols) {                          \
    constexpr size_t kRows = 4, kCols = 2 * V;                                               \
    const size_t full_rows = R / kRows * kRows, full_cols = n / kCols * kCols;               \
    for (size_t r = 0; r < full_rows; r += kRows) {                                          \
      for (size_t i = 0; i < full_cols; i += kCols) {                                        \
        VEC acc[kRows][2];                                                                   \
        for (size_t t = 0; t < kRows; t++) acc[t][0] = acc[t][1] = ZERO();                   \
        const float* c0 = coeffs + r * l.coeff_row;                                          \
        const float* row = rows + i;                                                         \
        for (size_t j = 0; j < m; j++, c0 += l.coeff_col, row += l.row_stride) {             \
          const VEC x0 = LOAD(row), x1 = LOAD(row + V);                                      \
          for (size_t t = 0; t < kRows; t++) {                                               \
            const float c = c0[t * l.coeff_row];                                             \
            if (kSkipZeros && c == 0.0f) continue;                                           \
            const VEC cv = SET1(c);                                                          \
            acc[t][0] = FMA(cv, x0, acc[t][0]);                                              \
            acc[t][1] = FMA(cv, x1, acc[t][1]);                                              \
          }                                                                                  \
        }                                                                                    \
        for (size_t t = 0; t < kRows; t++) {                                                 \
          float* o = out + (r + t) * l.out_stride + i;                                       \
          STORE(o, acc[t][0]);                                                               \
          STORE(o + V, acc[t][1]);                                                           \
        }                                                                                    \
      }                                                                                      \
    }                                                                                        \
    /* What the tiles left, a vector at a time: the rows past the last full tile, and  */    \
    /* the columns past the last full tile in the others.                              */    \
    const size_t full_vectors = n / V * V;                                                   \
    for (size_t r = 0; r < R; r++) {                                                         \
      for (size_t i = r < full_rows ? full_cols : 0; i < full_vectors; i += V) {             \
        VEC acc = ZERO();                                                                    \
        for (size_t j = 0; j < m; j++) {                                                     \
          const float c = coeff_at(coeffs, l, r, j);                                         \
          if (kSkipZeros && c == 0.0f) continue;                                             \
          acc = FMA(SET1(c), LOAD(rows + j * l.row_stride + i), acc);                        \
        }                                                                                    \
        STORE(out + r * l.out_stride + i, acc);                                              \
      }                                                                                      \
    }                                                                                        \
    done_cols = full_vectors;                                                                \
  }

TANDEM_COMBINE_KERNEL(combine_avx2, TANDEM_AVX2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
                      _mm256_fmadd_ps, _mm256_setzero_ps, _mm256_set1_ps)
TANDEM_COMBINE_KERNEL(combine_avx512, TANDEM_AVX512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
                      _mm512_fmadd_ps, _mm512_setzero_ps, _mm512_set1_ps)

}  // namespace

void combine_rows(SimdTarget target, float* out, const float* coeffs, const float* rows,
                  const CombineLayout& layout, size_t R, size_t m, size_t n,
                  bool skip_zero_coefficients) {
  size_t done = 0;  // columns [0, done) computed by a vector kernel
  const bool skip = skip_zero_coefficients;
  switch (target) {
    case SimdTarget::kAvx512:
      if (skip) {
        combine_avx512<true>(out, coeffs, rows, layout, R, m, n, done);
      } else {
        combine_avx512<false>(out, coeffs, rows, layout, R, m, n, done);
      }
      // Columns narrower than a 16-wide vector may still fill 8-wide ones.
      if (done < n) {
        size_t more = 0;
        if (skip) {
          combine_avx2<true>(out + done, coeffs, rows + done, layout, R, m, n - done, more);
        } else {
          combine_avx2<false>(out + done, coeffs, rows + done, layout, R, m, n - done, more);
        }
        done += more;
      }
      break;
    case SimdTarget::kAvx2:
      if (skip) {
        combine_avx2<true>(out, coeffs, rows, layout, R, m, n, done);
      } else {
        combine_avx2<false>(out, coeffs, rows, layout, R, m, n, done);
      }
      break;
    case SimdTarget::kScalar:
      break;
    default:
      fail("combine_rows: unknown SIMD target");
  }
  if (done < n) combine_scalar(out, coeffs, rows, layout, skip, 0, R, m, done, n);
}

}  // namespace tandem
