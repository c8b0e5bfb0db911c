// One AdamW element update: the exact sequence of IEEE operations that defines
// tandem's AdamW. The scalar reference and the CUDA kernel both call this function;
// the SIMD kernels spell out the same operations with intrinsics. Every operation is
// correctly rounded on every target (fma, sqrt and division included; CUDA code is
// built with -fmad=false and IEEE division and square root), so all agree bit for bit.
#pragma once

#include <cmath>

#include "tandem/core/host_device.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

struct AdamWElement {
  float param, m, v;
};

TANDEM_HOST_DEVICE inline AdamWElement adamw_element(float param, float grad, float m, float v,
                                                     const AdamWStepScalars& s) {
  const float g = grad * s.grad_scale;
  const float m_new = std::fma(s.beta1, m, s.one_minus_beta1 * g);
  const float v_new = std::fma(s.beta2, v, (s.one_minus_beta2 * g) * g);
  const float denom = std::fma(std::sqrt(v_new), s.inv_sqrt_bc2, s.eps);
  const float decayed = param * s.decay_factor;
  return {std::fma(-s.step_size, m_new / denom, decayed), m_new, v_new};
}

}  // namespace tandem
