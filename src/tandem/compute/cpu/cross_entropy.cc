// Softmax cross-entropy over the vocabulary; a negative target (kIgnoredTarget) is a
// position whose prediction the loss does not count: loss 0, gradient 0.
#include <cmath>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {

// log(sum(exp(row))) computed stably around the row maximum.
float row_logsumexp(const float* row, int V) {
  float max_value = row[0];
  for (int v = 1; v < V; v++) max_value = row[v] > max_value ? row[v] : max_value;
  float sum = 0.0f;
  for (int v = 0; v < V; v++) sum += std::exp(row[v] - max_value);
  return max_value + std::log(sum);
}

}  // namespace

void cross_entropy_forward(ThreadPool& pool, float* losses, const float* logits,
                           const int32_t* targets, int N, int V) {
  pool.parallel_for(N, rows_per_chunk(V), [&](size_t first, size_t last) {
    for (size_t n = first; n < last; n++) {
      const float* row = logits + n * V;
      losses[n] = targets[n] < 0 ? 0.0f : row_logsumexp(row, V) - row[targets[n]];
    }
  });
}

void cross_entropy_backward(ThreadPool& pool, float* dlogits, const float* logits,
                            const int32_t* targets, float dloss, int N, int V) {
  pool.parallel_for(N, rows_per_chunk(V), [&](size_t first, size_t last) {
    for (size_t n = first; n < last; n++) {
      const float* row = logits + n * V;
      float* drow = dlogits + n * V;
      if (targets[n] < 0) {
        for (int v = 0; v < V; v++) drow[v] = 0.0f;
        continue;
      }
      const float lse = row_logsumexp(row, V);
      for (int v = 0; v < V; v++) drow[v] = dloss * std::exp(row[v] - lse);
      drow[targets[n]] -= dloss;
    }
  });
}

}  // namespace tandem::cpu
