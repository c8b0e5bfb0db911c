// Causal multi-head attention that never stores the T x T probability matrix: the
// forward pass keeps each row's log-sum-exp, and the backward pass recomputes the
// probabilities from it (the flash-attention recipe, here on the CPU).
//
// Grouped-query heads: query head h reads key/value head h / (NH/KVH). The forward pass
// is split by (batch, query head), the backward by (batch, key/value head), whose query
// heads add to its dk and dv one after the other, in order. Each work item first copies
// its keys (and, backward, its values) into a transposed [hs, T] scratch, so that a query's scores
// against all keys are hs passes of a contiguous multiply-add over t2: that loop vectorises, and
// each score still sums its hs products in index order, whatever the vector width. Queries go
// kQueryBlock at a time, sharing each pass over the keys (and, backward, over dk and dv),
// with every sum in the order one query at a time would take. The sums over keys (P V
// forward, dS K backward) read the values (keys) from panels of 16 columns packed once per
// work item, and hold each column's partial sums in registers across the keys. The exps use
// fast_math.h's vectorisable exp.
//
// Determinism: every sum here runs in an order fixed by the code (no `omp simd
// reduction` on a sum, whose grouping would follow the vector width), no work item's
// result depends on another's, and target_clones is limited to AVX2 (no FMA) and the
// SSE2 baseline. So the results are bit-identical for any thread count and on any
// x86-64 machine.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/compute/cpu/fast_math.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {

// dot[t] = sum_i a[t * stride + i] * b[t * stride + i] over i < n in index order, for rows
// t < T. Eight rows go together, so that their eight chains of dependent adds overlap.
inline void row_dots_in_order(float* __restrict dot, const float* a, const float* b, size_t stride,
                              int T, int n) {
  constexpr int kRows = 8;
  for (int t0 = 0; t0 < T; t0 += kRows) {
    const int rows = std::min(kRows, T - t0);
    float sum[kRows] = {};
    for (int i = 0; i < n; i++) {
      for (int j = 0; j < rows; j++) sum[j] += a[(t0 + j) * stride + i] * b[(t0 + j) * stride + i];
    }
    for (int j = 0; j < rows; j++) dot[t0 + j] = sum[j];
  }
}

// Eight floats in one AVX register (two SSE registers in the baseline build). The kernels
// that keep running sums in registers across a loop, instead of loading and storing them
// at every term, hold them in these; each lane is its own sum, so the width changes no
// result.
using f32x8 = float __attribute__((vector_size(32)));
// The same at any address (4-byte aligned, like the floats it is read from or written to).
typedef float f32x8_unaligned __attribute__((vector_size(32), aligned(4), may_alias));

inline const f32x8_unaligned* vector_at(const float* p) {
  return reinterpret_cast<const f32x8_unaligned*>(p);
}
inline f32x8_unaligned* vector_at(float* p) { return reinterpret_cast<f32x8_unaligned*>(p); }

// Rows of a head transposed per tile: 8 rows read, then written as 8 contiguous floats of
// each column, so the writes go to a few lines at a time instead of one float to each of hs
// lines per row.
constexpr int kTransposeTile = 8;

// kt[hs, T] = the transpose of x's rows t = 0..T-1, x[t * stride + i], i < hs.
inline void transpose_head(float* __restrict kt, const float* __restrict x, size_t stride, int T,
                           int hs) {
  for (int t0 = 0; t0 < T; t0 += kTransposeTile) {
    const int rows = std::min(kTransposeTile, T - t0);
    for (int i = 0; i < hs; i++) {
      for (int j = 0; j < rows; j++)
        kt[static_cast<size_t>(i) * T + t0 + j] = x[(t0 + j) * stride + i];
    }
  }
}

// The inverse: x[t * stride + i] = kt[i, t] for t < T, i < hs.
inline void untranspose_head(float* __restrict x, size_t stride, const float* __restrict kt, int T,
                             int hs) {
  for (int t0 = 0; t0 < T; t0 += kTransposeTile) {
    const int rows = std::min(kTransposeTile, T - t0);
    for (int j = 0; j < rows; j++) {
      for (int i = 0; i < hs; i++)
        x[(t0 + j) * stride + i] = kt[static_cast<size_t>(i) * T + t0 + j];
    }
  }
}

// s[t2] = sum_i a[i] * mt[i, t2] for t2 < n, with mt[hs, T] (row stride T); i in
// order, four rows per pass over s to save loads and stores of s.
inline void scores_in_order(float* __restrict s, const float* __restrict a,
                            const float* __restrict mt, int n, int T, int hs) {
#pragma omp simd
  for (int t2 = 0; t2 < n; t2++) s[t2] = 0.0f;
  int i = 0;
  for (; i + 4 <= hs; i += 4) {
    const float a0 = a[i], a1 = a[i + 1], a2 = a[i + 2], a3 = a[i + 3];
    const float* r0 = mt + static_cast<size_t>(i) * T;
    const float* r1 = r0 + T;
    const float* r2 = r1 + T;
    const float* r3 = r2 + T;
#pragma omp simd
    for (int t2 = 0; t2 < n; t2++) {
      s[t2] = (((s[t2] + a0 * r0[t2]) + a1 * r1[t2]) + a2 * r2[t2]) + a3 * r3[t2];
    }
  }
  for (; i < hs; i++) {
    const float ai = a[i];
    const float* r = mt + static_cast<size_t>(i) * T;
#pragma omp simd
    for (int t2 = 0; t2 < n; t2++) s[t2] += ai * r[t2];
  }
}

// scores_in_order for m <= 4 queries at once: s[j * T + t2] = sum_i a[j][i] * mt[i, t2] for
// t2 < n, each sum in scores_in_order's order (i in order, four per pass), so every score
// has its bits; one pass over mt serves the m queries.
inline void scores_in_order_block(float* __restrict s, const float* const* a, int m,
                                  const float* __restrict mt, int n, int T, int hs) {
  if (m < 4) {
    for (int j = 0; j < m; j++) scores_in_order(s + static_cast<size_t>(j) * T, a[j], mt, n, T, hs);
    return;
  }
  float* __restrict s0 = s;
  float* __restrict s1 = s0 + T;
  float* __restrict s2 = s1 + T;
  float* __restrict s3 = s2 + T;
#pragma omp simd
  for (int t2 = 0; t2 < n; t2++) s0[t2] = s1[t2] = s2[t2] = s3[t2] = 0.0f;
  int i = 0;
  for (; i + 4 <= hs; i += 4) {
    const float* r0 = mt + static_cast<size_t>(i) * T;
    const float* r1 = r0 + T;
    const float* r2 = r1 + T;
    const float* r3 = r2 + T;
    const float a00 = a[0][i], a01 = a[0][i + 1], a02 = a[0][i + 2], a03 = a[0][i + 3];
    const float a10 = a[1][i], a11 = a[1][i + 1], a12 = a[1][i + 2], a13 = a[1][i + 3];
    const float a20 = a[2][i], a21 = a[2][i + 1], a22 = a[2][i + 2], a23 = a[2][i + 3];
    const float a30 = a[3][i], a31 = a[3][i + 1], a32 = a[3][i + 2], a33 = a[3][i + 3];
#pragma omp simd
    for (int t2 = 0; t2 < n; t2++) {
      const float k0 = r0[t2], k1 = r1[t2], k2 = r2[t2], k3 = r3[t2];
      s0[t2] = (((s0[t2] + a00 * k0) + a01 * k1) + a02 * k2) + a03 * k3;
      s1[t2] = (((s1[t2] + a10 * k0) + a11 * k1) + a12 * k2) + a13 * k3;
      s2[t2] = (((s2[t2] + a20 * k0) + a21 * k1) + a22 * k2) + a23 * k3;
      s3[t2] = (((s3[t2] + a30 * k0) + a31 * k1) + a32 * k2) + a33 * k3;
    }
  }
  for (; i < hs; i++) {
    const float* r = mt + static_cast<size_t>(i) * T;
    const float b0 = a[0][i], b1 = a[1][i], b2 = a[2][i], b3 = a[3][i];
#pragma omp simd
    for (int t2 = 0; t2 < n; t2++) {
      s0[t2] += b0 * r[t2];
      s1[t2] += b1 * r[t2];
      s2[t2] += b2 * r[t2];
      s3[t2] += b3 * r[t2];
    }
  }
}

// Columns per panel of pack_panels: two vectors, whose four partial sums each (eight
// registers) weighted_row_sum keeps across all the rows.
constexpr int kPanel = 16;

size_t panel_floats(int T, int hs) {
  return static_cast<size_t>((hs + kPanel - 1) / kPanel) * kPanel * T;
}

// A head's rows x[t * stride + i] (t < T, i < hs) as panels of kPanel columns: panel c holds
// columns c kPanel .. c kPanel + kPanel - 1 of row 0, then of row 1, ... (columns past hs are
// 0). A sum over rows then reads a panel front to back; read in place, it would take a piece
// of each row a qkv row apart, addresses that share a few cache sets and evict each other.
inline void pack_panels(float* __restrict panels, const float* __restrict x, size_t stride, int T,
                        int hs) {
  for (int c0 = 0; c0 < hs; c0 += kPanel) {
    const int cols = std::min(kPanel, hs - c0);
    float* panel = panels + static_cast<size_t>(c0) * T;
    for (int t = 0; t < T; t++) {
      float* row = panel + static_cast<size_t>(t) * kPanel;
      std::memcpy(row, x + t * stride + c0, sizeof(float) * cols);
      std::fill(row + cols, row + kPanel, 0.0f);
    }
  }
}

// y[hs] = sum_t2 c[t2] * x[t2, i] over t2 < n, with x's rows packed by pack_panels (T rows).
// Row t2 goes into partial sum t2 % 4, and the four are added at the end in a fixed
// order, (p0 + p1) + (p2 + p3). One running sum per element would be a chain of n
// dependent adds; four chains keep the adders busy. A panel's partial sums stay in registers
// across all n rows; each lane is its own column's sum, so the padding changes nothing.
inline void weighted_row_sum(float* __restrict y, const float* __restrict c,
                             const float* __restrict panels, int n, int T, int hs) {
  constexpr int kVectors = kPanel / 8;
  for (int c0 = 0; c0 < hs; c0 += kPanel) {
    const float* panel = panels + static_cast<size_t>(c0) * T;
    f32x8 partial[4][kVectors] = {};
    int t2 = 0;
    for (; t2 + 4 <= n; t2 += 4) {
      for (int r = 0; r < 4; r++) {
        const float* row = panel + (t2 + r) * kPanel;
        for (int v = 0; v < kVectors; v++) partial[r][v] += c[t2 + r] * *vector_at(row + 8 * v);
      }
    }
    for (int r = 0; t2 + r < n; r++) {  // the last n % 4 rows, into partials 0..2
      const float* row = panel + (t2 + r) * kPanel;
      for (int v = 0; v < kVectors; v++) partial[r][v] += c[t2 + r] * *vector_at(row + 8 * v);
    }
    float sum[kPanel];
    for (int v = 0; v < kVectors; v++) {
      *vector_at(sum + 8 * v) = (partial[0][v] + partial[1][v]) + (partial[2][v] + partial[3][v]);
    }
    std::memcpy(y + c0, sum, sizeof(float) * std::min(kPanel, hs - c0));
  }
}

// Sum of x[n] in 8 interleaved partial sums (x[j], x[j+8], ... into lane j), then the
// lanes in order: vectorisable, and the same grouping on every instruction set.
inline float sum_in_lanes(const float* x, int n) {
  float lanes[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; j++) lanes[j] += x[i + j];
  }
  for (int j = 0; i + j < n; j++) lanes[j] += x[i + j];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// Queries processed together: their scores take one pass over the keys
// (scores_in_order_block), and in the backward pass their dk and dv contributions one pass
// over those rows (add_query_block), each element loaded and stored once per block instead
// of once per query. Every result keeps the bits of a query at a time.
constexpr int kQueryBlock = 4;

// Where one (batch, query head)'s tensors sit in qkv[B, T, (NH + 2 KVH) HS] and
// out[B, T, NH HS]: row strides and the first row's q, k, v and out.
struct HeadView {
  size_t stride;      // qkv row: (NH + 2 KVH) HS
  size_t out_stride;  // out row: NH HS
  size_t q, k, v;     // column offsets within a qkv row
  size_t o;           // column offset within an out row
};

HeadView head_view(int h, int NH, int KVH, int HS) {
  const int g = h / (NH / KVH);  // the key/value head query head h attends with
  const size_t hs = HS;
  return {(NH + 2 * static_cast<size_t>(KVH)) * hs, NH * hs, h * hs, (NH + g) * hs,
          (NH + KVH + static_cast<size_t>(g)) * hs, h * hs};
}

// One (batch b, query head h) of the forward pass, kQueryBlock queries at a time. kt[HS, T],
// vp[panel_floats(T, HS)] and w[kQueryBlock, T] are scratch.
__attribute__((target_clones("avx2", "default"))) void attention_forward_head(
    float* out, float* lse, const float* qkv, int b, int h, int T, int NH, int KVH, int hs,
    float* kt, float* vp, float* w) {
  const HeadView view = head_view(h, NH, KVH, hs);
  const size_t W = view.stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float* row0 = qkv + static_cast<size_t>(b) * T * W;
  transpose_head(kt, row0 + view.k, W, T, hs);
  pack_panels(vp, row0 + view.v, W, T, hs);
  const ClampRange exp_arg = opaque_clamp_range(kExpMinArg, kExpMaxArg);
  for (int t0 = 0; t0 < T; t0 += kQueryBlock) {
    const int m = std::min(kQueryBlock, T - t0);
    const float* q[kQueryBlock];
    for (int j = 0; j < m; j++) q[j] = row0 + (t0 + j) * W + view.q;
    // The block's last query sees t0 + m keys; the others ignore the scores past theirs.
    scores_in_order_block(w, q, m, kt, t0 + m, T, hs);
    for (int j = 0; j < m; j++) {
      const int t = t0 + j, n = t + 1;  // causal: keys 0..t
      float* wj = w + static_cast<size_t>(j) * T;
      // A max is exact in any order, so this reduction may follow the vector width.
      float max_score = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max_score)
      for (int t2 = 0; t2 < n; t2++) {
        wj[t2] *= scale;
        max_score = wj[t2] > max_score ? wj[t2] : max_score;
      }
      // exp(score - max) <= 1; the clamp only lifts values below exp(-86), which are
      // nothing next to the row's largest term, 1.
#pragma omp simd
      for (int t2 = 0; t2 < n; t2++) wj[t2] = fast_exp(exp_arg(wj[t2] - max_score));
      const float sum = sum_in_lanes(wj, n);
      const float inv_sum = 1.0f / sum;
#pragma omp simd
      for (int t2 = 0; t2 < n; t2++) wj[t2] *= inv_sum;  // the probabilities
      float* o = out + (static_cast<size_t>(b) * T + t) * view.out_stride + view.o;
      weighted_row_sum(o, wj, vp, n, T, hs);  // sum_t2 p[t2] v[t2]
      lse[(static_cast<size_t>(b) * NH + h) * T + t] = max_score + std::log(sum);
    }
  }
}

// For the queries t0 .. t0 + m - 1 (m <= kQueryBlock; query t0 + j attends to keys
// t2 < t0 + j + 1): dk[i, t2] += q_j[i] ds_j[t2] and dv[i, t2] += dout_j[i] p_j[t2], with
// the queries added to each element in order, t0 first: the sums a query at a time would
// make, to the bit. dkt, dvt [hs, T]; p, ds [kQueryBlock, T]; q, d_o the queries' rows.
inline void add_query_block(float* __restrict dkt, float* __restrict dvt, const float* p,
                            const float* ds, const float* const* q, const float* const* d_o, int t0,
                            int m, int T, int hs) {
  const size_t sT = T;
  const int n0 = t0 + 1;  // keys every query of the block attends to
  for (int i = 0; i < hs; i++) {
    float* __restrict dk_row = dkt + static_cast<size_t>(i) * T;
    float* __restrict dv_row = dvt + static_cast<size_t>(i) * T;
    if (m == kQueryBlock) {
      const float q0 = q[0][i], q1 = q[1][i], q2 = q[2][i], q3 = q[3][i];
      const float o0 = d_o[0][i], o1 = d_o[1][i], o2 = d_o[2][i], o3 = d_o[3][i];
      const float *ds0 = ds, *ds1 = ds + sT, *ds2 = ds + 2 * sT, *ds3 = ds + 3 * sT;
      const float *p0 = p, *p1 = p + sT, *p2 = p + 2 * sT, *p3 = p + 3 * sT;
#pragma omp simd
      for (int t2 = 0; t2 < n0; t2++) {
        dk_row[t2] = (((dk_row[t2] + q0 * ds0[t2]) + q1 * ds1[t2]) + q2 * ds2[t2]) + q3 * ds3[t2];
        dv_row[t2] = (((dv_row[t2] + o0 * p0[t2]) + o1 * p1[t2]) + o2 * p2[t2]) + o3 * p3[t2];
      }
    } else {
      for (int j = 0; j < m; j++) {
        const float qj = q[j][i], oj = d_o[j][i];
        const float* dsj = ds + j * sT;
        const float* pj = p + j * sT;
#pragma omp simd
        for (int t2 = 0; t2 < n0; t2++) {
          dk_row[t2] += qj * dsj[t2];
          dv_row[t2] += oj * pj[t2];
        }
      }
    }
    // Key t0 + k (k >= 1) is seen by queries k .. m - 1 of the block only, in order.
    for (int k = 1; k < m; k++) {
      const int t2 = t0 + k;
      for (int j = k; j < m; j++) {
        dk_row[t2] += q[j][i] * ds[j * sT + t2];
        dv_row[t2] += d_o[j][i] * p[j * sT + t2];
      }
    }
  }
}

// One (batch b, key/value head g) of the backward pass: its NH/KVH query heads in order,
// each writing its dq and adding to the group's dk and dv. kt, vt, dkt, dvt [HS, T], p,
// ds [kQueryBlock, T], d_dot_out[T] and kp[panel_floats(T, HS)] are scratch. dk and dv gather over
// all later queries of every query head of the group, so they accumulate in the transposed layout
// (contiguous over t2, like the scores), kQueryBlock queries at a time, and are written
// out at the end.
__attribute__((target_clones("avx2", "default"))) void attention_backward_group(
    float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int b,
    int g, int T, int NH, int KVH, int hs, float* kt, float* vt, float* dkt, float* dvt, float* p,
    float* ds, float* d_dot_out, float* kp) {
  const int group = NH / KVH;
  const HeadView first = head_view(g * group, NH, KVH, hs);
  const size_t W = first.stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float* row0 = qkv + static_cast<size_t>(b) * T * W;
  float* drow0 = dqkv + static_cast<size_t>(b) * T * W;
  transpose_head(kt, row0 + first.k, W, T, hs);
  pack_panels(kp, row0 + first.k, W, T, hs);
  transpose_head(vt, row0 + first.v, W, T, hs);
  std::memset(dkt, 0, sizeof(float) * hs * T);
  std::memset(dvt, 0, sizeof(float) * hs * T);
  const ClampRange exp_arg = opaque_clamp_range(kExpMinArg, kExpMaxArg);
  for (int h = g * group; h < (g + 1) * group; h++) {
    const HeadView view = head_view(h, NH, KVH, hs);
    // sum_t2 p[t2] * dp[t2] equals dout . out, which is cheaper to form.
    const size_t out0 = static_cast<size_t>(b) * T * view.out_stride + view.o;
    row_dots_in_order(d_dot_out, dout + out0, out + out0, view.out_stride, T, hs);
    for (int t0 = 0; t0 < T; t0 += kQueryBlock) {
      const int m = std::min(kQueryBlock, T - t0);
      const float* q[kQueryBlock];
      const float* d_o[kQueryBlock];
      for (int j = 0; j < m; j++) {
        q[j] = row0 + (t0 + j) * W + view.q;
        d_o[j] = dout + (static_cast<size_t>(b) * T + t0 + j) * view.out_stride + view.o;
      }
      scores_in_order_block(p, q, m, kt, t0 + m, T, hs);     // q . k[t2]
      scores_in_order_block(ds, d_o, m, vt, t0 + m, T, hs);  // dp[t2] = dout . v[t2]
      for (int j = 0; j < m; j++) {
        const int t = t0 + j, n = t + 1;
        float* pj = p + static_cast<size_t>(j) * T;
        float* dsj = ds + static_cast<size_t>(j) * T;
        const float d_dot_o = d_dot_out[t];
        const float row_lse = lse[(static_cast<size_t>(b) * NH + h) * T + t];
#pragma omp simd
        for (int t2 = 0; t2 < n; t2++) {
          pj[t2] = fast_exp(exp_arg(pj[t2] * scale - row_lse));
          dsj[t2] = pj[t2] * (dsj[t2] - d_dot_o) * scale;  // dL/d(q . k[t2])
        }
        weighted_row_sum(drow0 + t * W + view.q, dsj, kp, n, T, hs);  // dq = sum ds k
      }
      add_query_block(dkt, dvt, p, ds, q, d_o, t0, m, T, hs);
    }
  }
  untranspose_head(drow0 + first.k, W, dkt, T, hs);
  untranspose_head(drow0 + first.v, W, dvt, T, hs);
}

}  // namespace

void attention_forward(ThreadPool& pool, float* out, float* lse, const float* qkv, int B, int T,
                       int NH, int KVH, int HS) {
  const size_t hs = HS;
  // One item per (batch, head): a head is tens of microseconds of work or more.
  pool.parallel_for(static_cast<size_t>(B) * NH, 1, [&](size_t first, size_t last) {
    std::vector<float> kt(hs * T), vp(panel_floats(T, HS));  // this chunk's scratch
    std::vector<float> w(kQueryBlock * static_cast<size_t>(T));
    for (size_t bh = first; bh < last; bh++) {
      attention_forward_head(out, lse, qkv, static_cast<int>(bh / NH), static_cast<int>(bh % NH), T,
                             NH, KVH, HS, kt.data(), vp.data(), w.data());
    }
  });
}

void attention_backward(ThreadPool& pool, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int NH, int KVH, int HS) {
  const size_t hs = HS;
  pool.parallel_for(static_cast<size_t>(B) * KVH, 1, [&](size_t first, size_t last) {
    std::vector<float> kt(hs * T), vt(hs * T), dkt(hs * T), dvt(hs * T), kp(panel_floats(T, HS));
    std::vector<float> p(kQueryBlock * static_cast<size_t>(T)), ds(p.size()), d_dot_out(T);
    for (size_t bg = first; bg < last; bg++) {
      attention_backward_group(dqkv, dout, qkv, out, lse, static_cast<int>(bg / KVH),
                               static_cast<int>(bg % KVH), T, NH, KVH, HS, kt.data(), vt.data(),
                               dkt.data(), dvt.data(), p.data(), ds.data(), d_dot_out.data(),
                               kp.data());
    }
  });
}

}  // namespace tandem::cpu
