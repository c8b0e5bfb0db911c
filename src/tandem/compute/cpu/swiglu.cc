// SwiGLU (Llama's MLP activation) on a fused [gate | up] projection: out = silu(gate) * up,
// silu(g) = g * sigmoid(g). Elementwise, so any thread split gives the same bits.
#include <cmath>
#include <cstddef>

#include "tandem/compute/cpu/cpu_kernels.h"

namespace tandem::cpu {

void swiglu_forward(float* out, const float* inp, int N, int I) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* gate = inp + static_cast<size_t>(n) * 2 * I;
    const float* up = gate + I;
    float* o = out + static_cast<size_t>(n) * I;
    for (int i = 0; i < I; i++) {
      const float sigmoid = 1.0f / (1.0f + std::exp(-gate[i]));
      o[i] = gate[i] * sigmoid * up[i];
    }
  }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int I) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* gate = inp + static_cast<size_t>(n) * 2 * I;
    const float* up = gate + I;
    const float* d = dout + static_cast<size_t>(n) * I;
    float* dgate = dinp + static_cast<size_t>(n) * 2 * I;
    float* dup = dgate + I;
    for (int i = 0; i < I; i++) {
      const float g = gate[i];
      const float sigmoid = 1.0f / (1.0f + std::exp(-g));
      const float silu = g * sigmoid;
      // silu'(g) = sigmoid (1 + g (1 - sigmoid))
      dgate[i] = d[i] * up[i] * (sigmoid * (1.0f + g * (1.0f - sigmoid)));
      dup[i] = d[i] * silu;
    }
  }
}

}  // namespace tandem::cpu
