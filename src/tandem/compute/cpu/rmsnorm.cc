// RMSNorm forward and backward (Llama): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Each row's sums run in column order; the weight gradient goes column block by column
// block with rows in order, so the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "tandem/compute/cpu/cpu_kernels.h"

namespace tandem::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps,
                     int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* o = out + static_cast<size_t>(n) * C;
    float sum = 0.0f;
    for (int c = 0; c < C; c++) sum += x[c] * x[c];
    const float s = 1.0f / std::sqrt(sum / C + eps);
    for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  // With dnorm = dout * weight: dinp += (dnorm - x * rstd^2 * mean(dnorm * x)) * rstd.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* d = dout + static_cast<size_t>(n) * C;
    float* di = dinp + static_cast<size_t>(n) * C;
    const float s = rstd[n];
    float dot = 0.0f;
    for (int c = 0; c < C; c++) dot += weight[c] * d[c] * x[c];
    const float m = dot / C * s * s;
    for (int c = 0; c < C; c++) di[c] += (weight[c] * d[c] - x[c] * m) * s;
  }
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * kColumnBlock;
    const int c1 = std::min(C, c0 + kColumnBlock);
    float dw[kColumnBlock] = {};
    for (int n = 0; n < N; n++) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* d = dout + static_cast<size_t>(n) * C;
      for (int c = c0; c < c1; c++) dw[c - c0] += x[c] * rstd[n] * d[c];
    }
    for (int c = c0; c < c1; c++) dweight[c] += dw[c - c0];
  }
}

}  // namespace tandem::cpu
