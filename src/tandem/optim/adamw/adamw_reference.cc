#include "tandem/optim/adamw/adamw_reference.h"

#include <cmath>

#include "tandem/core/half.h"
#include "tandem/optim/adamw/adamw_math.h"

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

AdamWArrays AdamWArrays::slice(size_t offset) const {
  AdamWArrays out = *this;
  out.params += offset;
  out.m += offset;
  out.v += offset;
  const size_t grad_bytes = grad_dtype == GradDType::kF32 ? 4 : 2;
  out.grads = static_cast<const char*>(grads) + offset * grad_bytes;
  if (params16 != nullptr) out.params16 = static_cast<char*>(params16) + offset * 2;
  return out;
}

void adamw_reference(const AdamWArrays& a, size_t n, const AdamWStepScalars& s) {
  const float* grads_f32 = static_cast<const float*>(a.grads);
  const uint16_t* grads_bf16 = static_cast<const uint16_t*>(a.grads);
  uint16_t* params16 = static_cast<uint16_t*>(a.params16);
  for (size_t i = 0; i < n; i++) {
    const float grad =
        a.grad_dtype == GradDType::kF32 ? grads_f32[i] : bf16_to_float(grads_bf16[i]);
    const AdamWElement e = adamw_element(a.params[i], grad, a.m[i], a.v[i], s);
    const float p = e.param;
    a.m[i] = e.m;
    a.v[i] = e.v;
    a.params[i] = p;
    if (a.params16_dtype == WorkingDType::kBF16) params16[i] = float_to_bf16(p);
    if (a.params16_dtype == WorkingDType::kF16) params16[i] = float_to_fp16(p);
  }
}

}  // namespace tandem
