// Causal multi-head attention that never stores the T x T probability matrix: the
// forward pass keeps each row's log-sum-exp, and the backward pass recomputes the
// probabilities from it (the flash-attention recipe, here on the CPU).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tandem/compute/cpu/cpu_kernels.h"

namespace tandem::cpu {
namespace {

inline float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; i++) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float* y, float alpha, const float* x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += alpha * x[i];
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * static_cast<size_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
  {
    std::vector<float> weights(T);  // this thread's softmax row
#pragma omp for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int t = 0; t < T; t++) {
          const float* q = qkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
          float max_score = -std::numeric_limits<float>::infinity();
          for (int t2 = 0; t2 <= t; t2++) {
            const float* k = qkv + (static_cast<size_t>(b) * T + t2) * C3 + C + h * hs;
            const float score = dot(q, k, hs) * scale;
            weights[t2] = score;
            max_score = score > max_score ? score : max_score;
          }
          float sum = 0.0f;
          for (int t2 = 0; t2 <= t; t2++) {
            weights[t2] = std::exp(weights[t2] - max_score);
            sum += weights[t2];
          }
          const float inv_sum = 1.0f / sum;
          float* o = out + (static_cast<size_t>(b) * T + t) * C + h * hs;
          std::memset(o, 0, sizeof(float) * hs);
          for (int t2 = 0; t2 <= t; t2++) {
            const float* v = qkv + (static_cast<size_t>(b) * T + t2) * C3 + 2 * C + h * hs;
            axpy(o, weights[t2] * inv_sum, v, hs);
          }
          lse[(static_cast<size_t>(b) * NH + h) * T + t] = max_score + std::log(sum);
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * static_cast<size_t>(C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // One (batch, head) per work item: dk and dv of a head gather from every later query.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        float* row = dqkv + (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        std::memset(row, 0, sizeof(float) * hs);
        std::memset(row + C, 0, sizeof(float) * hs);
        std::memset(row + 2 * C, 0, sizeof(float) * hs);
      }
      for (int t = 0; t < T; t++) {
        const size_t qrow = (static_cast<size_t>(b) * T + t) * C3 + h * hs;
        const size_t orow = (static_cast<size_t>(b) * T + t) * C + h * hs;
        const float* q = qkv + qrow;
        const float* d_o = dout + orow;
        float* dq = dqkv + qrow;
        // sum_t2 p[t2] * dp[t2] equals dout . out, which is cheaper to form.
        const float d_dot_o = dot(d_o, out + orow, hs);
        const float row_lse = lse[(static_cast<size_t>(b) * NH + h) * T + t];
        for (int t2 = 0; t2 <= t; t2++) {
          const size_t krow = (static_cast<size_t>(b) * T + t2) * C3 + h * hs;
          const float* k = qkv + krow + C;
          const float* v = qkv + krow + 2 * C;
          const float p = std::exp(dot(q, k, hs) * scale - row_lse);
          const float dp = dot(d_o, v, hs);
          const float dscore = p * (dp - d_dot_o) * scale;
          axpy(dq, dscore, k, hs);
          axpy(dqkv + krow + C, dscore, q, hs);
          axpy(dqkv + krow + 2 * C, p, d_o, hs);
        }
      }
    }
  }
}

}  // namespace tandem::cpu
