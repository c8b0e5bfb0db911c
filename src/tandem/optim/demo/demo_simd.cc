// combine_rows for each target. As in adamw_simd.cc, the functions carry target attributes
// instead of the file being compiled with -mavx2, so no AVX instruction reaches a CPU
// without it.
//
// The vector kernels compute tiles of 6 output rows x 2 vectors: per j, two loads of
// rows[j] and six broadcast coefficients (one per output row) feed up to 12 fmas into 12
// independent accumulators, which keep both fma units busy through their latency and, with
// the two loaded vectors and the broadcast, fit AVX2's 16 registers. When zero row elements
// are skipped, each lane whose element is 0 keeps its accumulator (a masked fma on AVX-512,
// a blend on AVX2), as the scalar code does.
#include "tandem/optim/demo/demo_simd.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "tandem/core/error.h"

namespace tandem {
namespace {

#define TANDEM_AVX2 __attribute__((target("avx2,fma")))
#define TANDEM_AVX512 __attribute__((target("avx2,fma,avx512f")))

// Output rows per band and vectors per tile (see the file comment).
constexpr size_t kBandRows = 6, kTileVectors = 2;

inline float coeff_at(const float* coeffs, const CombineLayout& l, size_t r, size_t j) {
  return coeffs[r * l.coeff_row + j * l.coeff_col];
}

// Outputs [r0, r1) x [i0, i1), one element at a time.
void combine_scalar(float* out, const float* coeffs, const float* rows, const CombineLayout& l,
                    CombineSkip skip, size_t r0, size_t r1, size_t m, size_t i0, size_t i1) {
  for (size_t r = r0; r < r1; r++) {
    float* o = out + r * l.out_stride;
    for (size_t i = i0; i < i1; i++) o[i] = 0.0f;
    for (size_t j = 0; j < m; j++) {
      const float c = coeff_at(coeffs, l, r, j);
      const float* row = rows + j * l.row_stride;
      for (size_t i = i0; i < i1; i++) {
        if (skip == CombineSkip::kZeroRowElements && row[i] == 0.0f) continue;
        o[i] = std::fma(c, row[i], o[i]);
      }
    }
  }
}

// acc + c * x with one rounding, except in the lanes where x is +0 or -0: those keep acc.
TANDEM_AVX2 inline __m256 fma_unless_zero_avx2(__m256 c, __m256 x, __m256 acc) {
  const __m256 zero_lanes = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ);
  return _mm256_blendv_ps(_mm256_fmadd_ps(c, x, acc), acc, zero_lanes);
}
TANDEM_AVX512 inline __m512 fma_unless_zero_avx512(__m512 c, __m512 x, __m512 acc) {
  const __mmask16 live_lanes = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  return _mm512_mask3_fmadd_ps(c, x, acc, live_lanes);
}

// The vector kernels of a target: V floats per vector, Load/Store/Fma/Zero/Broadcast.
//
// NAME##_tile computes outputs [r, r + kRows) x [i, i + kVecs * V); NAME##_band the rows
// [r, r + kRows) across every full vector of columns (tiles of kVecs vectors, then single
// vectors); NAME all rows, in bands of kBandRows and one band of the remainder.
#define TANDEM_COMBINE_KERNEL(NAME, ATTR, VEC, V, LOAD, STORE, FMA, FMA_UNLESS_ZERO, ZERO, SET1) \
  template <CombineSkip kSkip, size_t kRows, size_t kVecs>                                       \
  ATTR inline void NAME##_tile(float* out, const float* coeffs, const float* rows,               \
                               const CombineLayout& l, size_t r, size_t i, size_t m) {           \
    VEC acc[kRows][kVecs];                                                                       \
    for (size_t t = 0; t < kRows; t++)                                                           \
      for (size_t v = 0; v < kVecs; v++) acc[t][v] = ZERO();                                     \
    const float* c0 = coeffs + r * l.coeff_row;                                                  \
    const float* row = rows + i;                                                                 \
    for (size_t j = 0; j < m; j++, c0 += l.coeff_col, row += l.row_stride) {                     \
      VEC x[kVecs];                                                                              \
      for (size_t v = 0; v < kVecs; v++) x[v] = LOAD(row + v * V);                               \
      for (size_t t = 0; t < kRows; t++) {                                                       \
        const float c = c0[t * l.coeff_row];                                                     \
        const VEC cv = SET1(c);                                                                  \
        for (size_t v = 0; v < kVecs; v++) {                                                     \
          if constexpr (kSkip == CombineSkip::kZeroRowElements) {                                \
            acc[t][v] = FMA_UNLESS_ZERO(cv, x[v], acc[t][v]);                                    \
          } else {                                                                               \
            acc[t][v] = FMA(cv, x[v], acc[t][v]);                                                \
          }                                                                                      \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
    for (size_t t = 0; t < kRows; t++) {                                                         \
      float* o = out + (r + t) * l.out_stride + i;                                               \
      for (size_t v = 0; v < kVecs; v++) STORE(o + v * V, acc[t][v]);                            \
    }                                                                                            \
  }                                                                                              \
                                                                                                 \
  template <CombineSkip kSkip, size_t kRows>                                                     \
  ATTR void NAME##_band(float* out, const float* coeffs, const float* rows,                      \
                        const CombineLayout& l, size_t r, size_t m, size_t vectors) {            \
    size_t v = 0;                                                                                \
    for (; v + kTileVectors <= vectors; v += kTileVectors)                                       \
      NAME##_tile<kSkip, kRows, kTileVectors>(out, coeffs, rows, l, r, v * V, m);                \
    for (; v < vectors; v++) NAME##_tile<kSkip, kRows, 1>(out, coeffs, rows, l, r, v * V, m);    \
  }                                                                                              \
                                                                                                 \
  template <CombineSkip kSkip>                                                                   \
  ATTR void NAME(float* out, const float* coeffs, const float* rows, const CombineLayout& l,     \
                 size_t R, size_t m, size_t n, size_t& done_cols) {                              \
    const size_t vectors = n / V;                                                                \
    size_t r = 0;                                                                                \
    for (; r + kBandRows <= R; r += kBandRows)                                                   \
      NAME##_band<kSkip, kBandRows>(out, coeffs, rows, l, r, m, vectors);                        \
    static_assert(kBandRows == 6, "the remainder switch below covers 1 to 5 rows");              \
    switch (R - r) {                                                                             \
      case 5:                                                                                    \
        NAME##_band<kSkip, 5>(out, coeffs, rows, l, r, m, vectors);                              \
        break;                                                                                   \
      case 4:                                                                                    \
        NAME##_band<kSkip, 4>(out, coeffs, rows, l, r, m, vectors);                              \
        break;                                                                                   \
      case 3:                                                                                    \
        NAME##_band<kSkip, 3>(out, coeffs, rows, l, r, m, vectors);                              \
        break;                                                                                   \
      case 2:                                                                                    \
        NAME##_band<kSkip, 2>(out, coeffs, rows, l, r, m, vectors);                              \
        break;                                                                                   \
      case 1:                                                                                    \
        NAME##_band<kSkip, 1>(out, coeffs, rows, l, r, m, vectors);                              \
        break;                                                                                   \
      default:                                                                                   \
        break;                                                                                   \
    }                                                                                            \
    done_cols = vectors * V;                                                                     \
  }

TANDEM_COMBINE_KERNEL(combine_avx2, TANDEM_AVX2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
                      _mm256_fmadd_ps, fma_unless_zero_avx2, _mm256_setzero_ps, _mm256_set1_ps)
TANDEM_COMBINE_KERNEL(combine_avx512, TANDEM_AVX512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
                      _mm512_fmadd_ps, fma_unless_zero_avx512, _mm512_setzero_ps, _mm512_set1_ps)

// The vector kernels of `target` over as many columns as they cover (done: how many).
template <CombineSkip kSkip>
void combine_vectors(SimdTarget target, float* out, const float* coeffs, const float* rows,
                     const CombineLayout& layout, size_t R, size_t m, size_t n, size_t& done) {
  switch (target) {
    case SimdTarget::kAvx512:
      combine_avx512<kSkip>(out, coeffs, rows, layout, R, m, n, done);
      // Columns narrower than a 16-wide vector may still fill 8-wide ones.
      if (done < n) {
        size_t more = 0;
        combine_avx2<kSkip>(out + done, coeffs, rows + done, layout, R, m, n - done, more);
        done += more;
      }
      break;
    case SimdTarget::kAvx2:
      combine_avx2<kSkip>(out, coeffs, rows, layout, R, m, n, done);
      break;
    case SimdTarget::kScalar:
      break;
    default:
      fail("combine_rows: unknown SIMD target");
  }
}

// combine_sparse_row's columns [i0, n) one at a time, and its vector kernels: 4 vectors of
// columns per pass (64 floats on AVX-512, a 64-wide block's row in one pass), then single
// vectors; `done` says how far they got.
void combine_sparse_scalar(float* out, const float* coeffs, const int32_t* js, size_t count,
                           const float* rows, size_t row_stride, size_t i0, size_t n) {
  for (size_t i = i0; i < n; i++) {
    float acc = 0.0f;
    for (size_t t = 0; t < count; t++)
      acc = std::fma(coeffs[t], rows[static_cast<size_t>(js[t]) * row_stride + i], acc);
    out[i] = acc;
  }
}

#define TANDEM_SPARSE_KERNEL(NAME, ATTR, VEC, V, LOAD, STORE, FMA, ZERO, SET1)                   \
  template <size_t kVecs>                                                                        \
  ATTR inline void NAME##_pass(float* out, const float* coeffs, const int32_t* js, size_t count, \
                               const float* rows, size_t row_stride, size_t i) {                 \
    VEC acc[kVecs];                                                                              \
    for (size_t v = 0; v < kVecs; v++) acc[v] = ZERO();                                          \
    for (size_t t = 0; t < count; t++) {                                                         \
      const VEC c = SET1(coeffs[t]);                                                             \
      const float* row = rows + static_cast<size_t>(js[t]) * row_stride + i;                     \
      for (size_t v = 0; v < kVecs; v++) acc[v] = FMA(c, LOAD(row + v * V), acc[v]);             \
    }                                                                                            \
    for (size_t v = 0; v < kVecs; v++) STORE(out + i + v * V, acc[v]);                           \
  }                                                                                              \
  ATTR void NAME(float* out, const float* coeffs, const int32_t* js, size_t count,               \
                 const float* rows, size_t row_stride, size_t n, size_t& done) {                 \
    size_t i = 0;                                                                                \
    for (; i + 4 * V <= n; i += 4 * V)                                                           \
      NAME##_pass<4>(out, coeffs, js, count, rows, row_stride, i);                               \
    for (; i + V <= n; i += V) NAME##_pass<1>(out, coeffs, js, count, rows, row_stride, i);      \
    done = i;                                                                                    \
  }

TANDEM_SPARSE_KERNEL(sparse_avx2, TANDEM_AVX2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps,
                     _mm256_fmadd_ps, _mm256_setzero_ps, _mm256_set1_ps)
TANDEM_SPARSE_KERNEL(sparse_avx512, TANDEM_AVX512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
                     _mm512_fmadd_ps, _mm512_setzero_ps, _mm512_set1_ps)

}  // namespace

void combine_rows(SimdTarget target, float* out, const float* coeffs, const float* rows,
                  const CombineLayout& layout, size_t R, size_t m, size_t n, CombineSkip skip) {
  size_t done = 0;  // columns [0, done) computed by a vector kernel
  switch (skip) {
    case CombineSkip::kNone:
      combine_vectors<CombineSkip::kNone>(target, out, coeffs, rows, layout, R, m, n, done);
      break;
    case CombineSkip::kZeroRowElements:
      combine_vectors<CombineSkip::kZeroRowElements>(target, out, coeffs, rows, layout, R, m, n,
                                                     done);
      break;
  }
  if (done < n) combine_scalar(out, coeffs, rows, layout, skip, 0, R, m, done, n);
}

void combine_sparse_row(SimdTarget target, float* out, const float* coeffs, const int32_t* js,
                        size_t count, const float* rows, size_t row_stride, size_t n) {
  size_t done = 0;  // columns [0, done) computed by a vector kernel
  switch (target) {
    case SimdTarget::kAvx512:
      sparse_avx512(out, coeffs, js, count, rows, row_stride, n, done);
      if (done < n) {
        size_t more = 0;
        sparse_avx2(out + done, coeffs, js, count, rows + done, row_stride, n - done, more);
        done += more;
      }
      break;
    case SimdTarget::kAvx2:
      sparse_avx2(out, coeffs, js, count, rows, row_stride, n, done);
      break;
    case SimdTarget::kScalar:
      break;
    default:
      fail("combine_sparse_row: unknown SIMD target");
  }
  if (done < n) combine_sparse_scalar(out, coeffs, js, count, rows, row_stride, done, n);
}

}  // namespace tandem
