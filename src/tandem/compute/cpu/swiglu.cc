// SwiGLU (Llama's MLP activation) on a fused [gate | up] projection: out = silu(gate) * up,
// silu(g) = g * sigmoid(g). Elementwise, so any thread split gives the same bits; the
// sigmoid's exp is fast_math.h's, so the rows vectorise and every instruction set computes
// the same floats.
#include <cstddef>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/compute/cpu/fast_math.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {

// sigmoid(g) = 1 / (1 + exp(-g)). The clamp only matters at the ends: exp(-g) overflows to
// +inf from -g = 88.73 on, as expf does (sigmoid exactly 0), and below exp(-86) it is
// nothing next to 1 (sigmoid exactly 1). A NaN g gives 1, but g itself carries the NaN
// into every result.
inline float sigmoid(float g, const ClampRange& exp_arg) {
  return 1.0f / (1.0f + fast_exp(exp_arg(-g)));
}

__attribute__((target_clones("avx2", "default"))) void swiglu_forward_row(
    float* __restrict out, const float* __restrict gate, const float* __restrict up, int I) {
  const ClampRange exp_arg = opaque_clamp_range(kExpMinArg, kExpMaxArg);
#pragma omp simd
  for (int i = 0; i < I; i++) out[i] = gate[i] * sigmoid(gate[i], exp_arg) * up[i];
}

__attribute__((target_clones("avx2", "default"))) void swiglu_backward_row(
    float* __restrict dgate, float* __restrict dup, const float* __restrict gate,
    const float* __restrict up, const float* __restrict d, int I) {
  const ClampRange exp_arg = opaque_clamp_range(kExpMinArg, kExpMaxArg);
#pragma omp simd
  for (int i = 0; i < I; i++) {
    const float g = gate[i];
    const float s = sigmoid(g, exp_arg);
    // silu'(g) = sigmoid (1 + g (1 - sigmoid))
    dgate[i] = d[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
    dup[i] = d[i] * (g * s);
  }
}

}  // namespace

void swiglu_forward(ThreadPool& pool, float* out, const float* inp, int N, int I) {
  pool.parallel_for(N, rows_per_chunk(3 * static_cast<size_t>(I)), [&](size_t first, size_t last) {
    for (size_t n = first; n < last; n++) {
      const float* gate = inp + n * 2 * I;
      swiglu_forward_row(out + n * I, gate, gate + I, I);
    }
  });
}

void swiglu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, int N,
                     int I) {
  pool.parallel_for(N, rows_per_chunk(5 * static_cast<size_t>(I)), [&](size_t first, size_t last) {
    for (size_t n = first; n < last; n++) {
      const float* gate = inp + n * 2 * I;
      float* dgate = dinp + n * 2 * I;
      swiglu_backward_row(dgate, dgate + I, gate, gate + I, dout + n * I, I);
    }
  });
}

}  // namespace tandem::cpu
