#include "tandem/core/transpose.h"

#include <immintrin.h>

#include <algorithm>

#include "tandem/core/cpu_features.h"

namespace tandem {
namespace {

// Tiles of kTile x kTile: a tile's 32 source rows and 32 destination rows (4 KiB each way)
// stay in L1 while it is walked, where a row-by-row walk would write a column of `out` a
// cache line apart per element.
constexpr int64_t kTile = 32;

// out[c - c0][r] = in[r][c] for r in [r0, r1), c in [ct, ce), one element at a time.
void transpose_tile_scalar(const float* in, int64_t cols, int64_t rows, int64_t r0, int64_t r1,
                           int64_t ct, int64_t ce, int64_t c0, float* out) {
  for (int64_t c = ct; c < ce; c++)
    for (int64_t r = r0; r < r1; r++) out[(c - c0) * rows + r] = in[r * cols + c];
}

// The 8 x 8 block at in[r][c] (row stride cols) transposed into out[c - c0][r] (row stride
// rows): eight row loads, three rounds of unpack and shuffle, eight row stores.
__attribute__((target("avx2"))) inline void transpose_8x8_avx2(const float* in, int64_t cols,
                                                               float* out, int64_t rows) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(in + i * cols);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps(out + i * rows, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * rows, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

__attribute__((target("avx2"))) void transpose_rows_avx2(const float* in, int64_t rows,
                                                         int64_t cols, int64_t c0, int64_t c1,
                                                         float* out) {
  for (int64_t ct = c0; ct < c1; ct += kTile)
    for (int64_t rt = 0; rt < rows; rt += kTile) {
      const int64_t ce = std::min(c1, ct + kTile), re = std::min(rows, rt + kTile);
      const int64_t c8 = ct + (ce - ct) / 8 * 8, r8 = rt + (re - rt) / 8 * 8;
      for (int64_t c = ct; c < c8; c += 8)
        for (int64_t r = rt; r < r8; r += 8)
          transpose_8x8_avx2(in + r * cols + c, cols, out + (c - c0) * rows + r, rows);
      // The tile's ragged edges: its last columns, then its last rows.
      transpose_tile_scalar(in, cols, rows, rt, re, c8, ce, c0, out);
      transpose_tile_scalar(in, cols, rows, r8, re, ct, c8, c0, out);
    }
}

}  // namespace

void transpose_rows(const float* in, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                    float* out) {
  if (cpu_supports(SimdTarget::kAvx2)) {
    transpose_rows_avx2(in, rows, cols, c0, c1, out);
    return;
  }
  for (int64_t ct = c0; ct < c1; ct += kTile)
    for (int64_t rt = 0; rt < rows; rt += kTile)
      transpose_tile_scalar(in, cols, rows, rt, std::min(rows, rt + kTile), ct,
                            std::min(c1, ct + kTile), c0, out);
}

}  // namespace tandem
