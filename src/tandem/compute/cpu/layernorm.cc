// LayerNorm forward and backward (eps 1e-5, as GPT-2).
#include <algorithm>
#include <cmath>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {
constexpr float kEps = 1e-5f;
}  // namespace

void layernorm_forward(ThreadPool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  pool.parallel_for(N, rows_per_chunk(C), [&](size_t first, size_t last) {
    for (size_t n = first; n < last; n++) {
      const float* x = inp + n * C;
      float* o = out + n * C;
      float sum = 0.0f;
      for (int c = 0; c < C; c++) sum += x[c];
      const float m = sum / C;
      float var_sum = 0.0f;
      for (int c = 0; c < C; c++) {
        const float d = x[c] - m;
        var_sum += d * d;
      }
      const float s = 1.0f / std::sqrt(var_sum / C + kEps);
      for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

void layernorm_backward(ThreadPool& pool, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C) {
  // Input gradient, row by row:
  //   dnorm = dout * weight
  //   dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
  pool.parallel_for(N, rows_per_chunk(C), [&](size_t first, size_t last) {
    for (size_t n = first; n < last; n++) {
      const float* x = inp + n * C;
      const float* d = dout + n * C;
      float* di = dinp + n * C;
      const float m = mean[n];
      const float s = rstd[n];
      float dnorm_mean = 0.0f;
      float dnorm_norm_mean = 0.0f;
      for (int c = 0; c < C; c++) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * d[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      for (int c = 0; c < C; c++) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * d[c];
        di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  });
  // Parameter gradients: column blocks in parallel, rows in order (deterministic).
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  pool.parallel_for(blocks, 1, [&](size_t first, size_t last) {
    for (size_t blk = first; blk < last; blk++) {
      const int c0 = static_cast<int>(blk) * kColumnBlock;
      const int c1 = std::min(C, c0 + kColumnBlock);
      float dw[kColumnBlock] = {};
      float db[kColumnBlock] = {};
      for (int n = 0; n < N; n++) {
        const float* x = inp + static_cast<size_t>(n) * C;
        const float* d = dout + static_cast<size_t>(n) * C;
        for (int c = c0; c < c1; c++) {
          dw[c - c0] += (x[c] - mean[n]) * rstd[n] * d[c];
          db[c - c0] += d[c];
        }
      }
      for (int c = c0; c < c1; c++) {
        dweight[c] += dw[c - c0];
        dbias[c] += db[c - c0];
      }
    }
  });
}

}  // namespace tandem::cpu
