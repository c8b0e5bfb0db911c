#include "tandem/optim/adamw_reference.h"

#include <cmath>

namespace tandem {

AdamWStepScalars adamw_step_scalars(const AdamWHyper& hyper, int64_t step, bool weight_decay,
                                    float grad_scale) {
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(hyper.beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(hyper.beta2), step);
  AdamWStepScalars s;
  s.beta1 = hyper.beta1;
  s.beta2 = hyper.beta2;
  s.one_minus_beta1 = static_cast<float>(1.0 - hyper.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - hyper.beta2);
  s.step_size = static_cast<float>(hyper.lr / bias_correction1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  s.eps = hyper.eps;
  s.decay_factor =
      weight_decay ? static_cast<float>(1.0 - static_cast<double>(hyper.lr) * hyper.weight_decay)
                   : 1.0f;
  s.grad_scale = grad_scale;
  return s;
}

void adamw_reference(float* params, const float* grads, float* m, float* v, size_t n,
                     const AdamWStepScalars& s) {
  for (size_t i = 0; i < n; i++) {
    const float g = grads[i] * s.grad_scale;
    const float m_new = std::fma(s.beta1, m[i], s.one_minus_beta1 * g);
    const float v_new = std::fma(s.beta2, v[i], (s.one_minus_beta2 * g) * g);
    const float denom = std::fma(std::sqrt(v_new), s.inv_sqrt_bc2, s.eps);
    const float decayed = params[i] * s.decay_factor;
    params[i] = std::fma(-s.step_size, m_new / denom, decayed);
    m[i] = m_new;
    v[i] = v_new;
  }
}

}  // namespace tandem
