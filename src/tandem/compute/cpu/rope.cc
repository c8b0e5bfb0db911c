// Rotary position embeddings (Hugging Face's rotate-half form) in place on the query and
// key heads of a fused qkv tensor. The cosines and sines come from a host-computed table,
// so every backend rotates by the same fp32 numbers.
#include <cstddef>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {

// Turns each (x[i], x[i + HS/2]) of the NH + KVH rotated heads of every row by the row's
// angles; `sign` -1 turns the other way (the backward pass, whose Jacobian is the
// transposed rotation).
void rotate(ThreadPool& pool, float* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
            int HS, float sign) {
  const int half = HS / 2;
  const size_t W = static_cast<size_t>(NH + 2 * KVH) * HS;
  const int rotated_heads = NH + KVH;  // queries then keys; the values follow, untouched
  pool.parallel_for(static_cast<size_t>(B) * T, rows_per_chunk(W), [&](size_t first, size_t last) {
    for (size_t bt = first; bt < last; bt++) {
      float* row = qkv + bt * W;
      const float* angles = cos_sin + (bt % T) * half * 2;
      for (int h = 0; h < rotated_heads; h++) {
        float* x = row + static_cast<size_t>(h) * HS;
        for (int i = 0; i < half; i++) {
          const float c = angles[2 * i], s = sign * angles[2 * i + 1];
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * c - x2 * s;
          x[i + half] = x2 * c + x1 * s;
        }
      }
    }
  });
}

}  // namespace

void rope_forward(ThreadPool& pool, float* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                  int HS) {
  rotate(pool, qkv, cos_sin, B, T, NH, KVH, HS, 1.0f);
}

void rope_backward(ThreadPool& pool, float* dqkv, const float* cos_sin, int B, int T, int NH,
                   int KVH, int HS) {
  rotate(pool, dqkv, cos_sin, B, T, NH, KVH, HS, -1.0f);
}

}  // namespace tandem::cpu
