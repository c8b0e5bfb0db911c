// Embedding, GELU, residual, column-sum and sum-of-squares kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/compute/cpu/fast_math.h"
#include "tandem/compute/cpu/sum_of_squares.h"
#include "tandem/compute/embedding_backward_order.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {

double sum_of_squares(ThreadPool& pool, const float* x, size_t n) {
  return tandem::sum_of_squares(pool, x, n);
}

void sum_of_squares_blocks(ThreadPool& pool, const float* x, size_t n, double* partials) {
  tandem::sum_of_squares_blocks(pool, x, n, partials);
}

void column_sums_accumulate(ThreadPool& pool, float* sum, const float* x, int N, int C) {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  pool.parallel_for(blocks, 1, [&](size_t first, size_t last) {
    for (size_t blk = first; blk < last; blk++) {
      const int c0 = static_cast<int>(blk) * kColumnBlock;
      const int c1 = std::min(C, c0 + kColumnBlock);
      float acc[kColumnBlock] = {};
      for (int n = 0; n < N; n++) {
        const float* row = x + static_cast<size_t>(n) * C;
        for (int c = c0; c < c1; c++) acc[c - c0] += row[c];
      }
      for (int c = c0; c < c1; c++) sum[c] += acc[c - c0];
    }
  });
}

void encoder_forward(ThreadPool& pool, float* out, const int32_t* tokens, const float* wte,
                     const float* wpe, int B, int T, int C) {
  pool.parallel_for(static_cast<size_t>(B) * T, rows_per_chunk(C), [&](size_t first, size_t last) {
    for (size_t bt = first; bt < last; bt++) {
      float* o = out + bt * C;
      const float* tok = wte + static_cast<size_t>(tokens[bt]) * C;
      if (wpe == nullptr) {
        for (int c = 0; c < C; c++) o[c] = tok[c];
        continue;
      }
      const float* pos = wpe + (bt % T) * C;
      for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
    }
  });
}

void encoder_backward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout,
                      const int32_t* tokens, int B, int T, int C) {
  // dwpe: each position sums over the batch, b in order.
  if (dwpe != nullptr) {
    pool.parallel_for(T, rows_per_chunk(static_cast<size_t>(B) * C),
                      [&](size_t first, size_t last) {
                        for (size_t t = first; t < last; t++) {
                          float* dpos = dwpe + t * C;
                          for (int b = 0; b < B; b++) {
                            const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
                            for (int c = 0; c < C; c++) dpos[c] += d[c];
                          }
                        }
                      });
  }
  // dwte: a scatter-add by token id, in the order of embedding_backward_order.h (the
  // GPU's). A stable counting sort groups the positions by token.
  const int BT = B * T;
  if (BT == 0) return;
  const int32_t V = *std::max_element(tokens, tokens + BT) + 1;
  std::vector<int> run_start(static_cast<size_t>(V) + 1, 0);
  for (int bt = 0; bt < BT; bt++) run_start[tokens[bt] + 1]++;
  for (int32_t v = 0; v < V; v++) run_start[v + 1] += run_start[v];
  std::vector<int> sorted(BT);
  {
    std::vector<int> cursor(run_start.begin(), run_start.end() - 1);
    for (int bt = 0; bt < BT; bt++) sorted[cursor[tokens[bt]]++] = bt;
  }
  // Parallel over column blocks, so the order is the same whatever the thread count.
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  pool.parallel_for(blocks, 1, [&](size_t first_block, size_t last_block) {
    for (size_t blk = first_block; blk < last_block; blk++) {
      const int c0 = static_cast<int>(blk) * kColumnBlock;
      const int c1 = std::min(C, c0 + kColumnBlock);
      float piece[kColumnBlock];
      for (int32_t token = 0; token < V; token++) {
        const int first = run_start[token], end = run_start[token + 1];
        if (first == end) continue;
        float* drow = dwte + static_cast<size_t>(token) * C;
        std::fill(piece, piece + (c1 - c0), 0.0f);
        for (int j = first; j < end; j++) {
          const float* d = dout + static_cast<size_t>(sorted[j]) * C;
          for (int c = c0; c < c1; c++) piece[c - c0] += d[c];
          if ((j + 1) % kEmbeddingBackwardPiece == 0 || j + 1 == end) {
            for (int c = c0; c < c1; c++) drow[c] += piece[c - c0];
            std::fill(piece, piece + (c1 - c0), 0.0f);
          }
        }
      }
    }
  });
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

// GELU (tanh form) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). With
// tanh(u) = 1 - 2 / (exp(2u) + 1) this is x * sigma, sigma = 1 / (1 + exp(-2u)): one
// exp, no cancellation in (1 + tanh) for negative x, and no libm call, so the loop
// vectorises (fast_math.h). For the derivative, sech^2(u) = 1 - tanh^2(u) =
// 4 sigma (1 - sigma), and 1 - sigma = exp(-2u) sigma is again cancellation-free.
//
// The loops have no branches or selects other than clamps: under the default
// -ftrapping-math GCC will not if-convert a select that follows a division, and the
// loop would stay scalar. Saturation comes out of the arithmetic instead (below).
//
// target_clones: an AVX2 and a baseline (SSE2) build of each loop, picked at load
// time. No AVX-512 clone: it would enable FMA contraction and so round differently,
// while these two evaluate the same operations and give bit-identical results.

// Beyond |x| = 20 the derivative is 1 or 0 to within 1e-35, so the backward pass
// evaluates it at x clamped to this; that keeps the x^3 factor finite.
constexpr float kGeluBackwardClamp = 20.0f;

__attribute__((target_clones("avx2", "default"))) void gelu_forward_range(float* out,
                                                                          const float* inp,
                                                                          size_t n) {
  const ClampRange exp_arg = opaque_clamp_range(kExpMinArg, kExpMaxArg);
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    // For very negative x, exp(-2u) overflows to +inf and sigma is exactly 0; for very
    // positive x it is tiny and sigma is exactly 1.
    const float sigma = 1.0f / (1.0f + fast_exp(exp_arg(-2.0f * u)));
    out[i] = x * sigma;  // a NaN x stays NaN
  }
}

__attribute__((target_clones("avx2", "default"))) void gelu_backward_range(float* dinp,
                                                                           const float* inp,
                                                                           const float* dout,
                                                                           size_t n) {
  const ClampRange x_range = opaque_clamp_range(-kGeluBackwardClamp, kGeluBackwardClamp);
  // Tops out at exp(88), finite, so that e * sigma below is never inf * 0.
  const ClampRange exp_arg = opaque_clamp_range(kExpMinArg, 88.0f);
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    const float x = x_range(inp[i]);
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float e = fast_exp(exp_arg(-2.0f * u));
    const float sigma = 1.0f / (1.0f + e);  // 0.5 (1 + tanh(u))
    const float sech_sq = 4.0f * sigma * (e * sigma);
    const float grad = sigma + x * 0.5f * sech_sq * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    // inp * 0 is 0 for finite inputs and NaN for NaN or inf ones, which the clamp above
    // would otherwise hide (the libm version gives NaN there too).
    dinp[i] = (grad + inp[i] * 0.0f) * dout[i];
  }
}

}  // namespace

void gelu_forward(ThreadPool& pool, float* out, const float* inp, size_t N) {
  pool.parallel_for(N, kChunkFloats, [&](size_t begin, size_t end) {
    gelu_forward_range(out + begin, inp + begin, end - begin);
  });
}

void gelu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, size_t N) {
  pool.parallel_for(N, kChunkFloats, [&](size_t begin, size_t end) {
    gelu_backward_range(dinp + begin, inp + begin, dout + begin, end - begin);
  });
}

void residual_forward(ThreadPool& pool, float* out, const float* a, const float* b, size_t N) {
  pool.parallel_for(N, kChunkFloats, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) out[i] = a[i] + b[i];
  });
}

}  // namespace tandem::cpu
