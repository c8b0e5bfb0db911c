// The scalar AdamW reference: the oracle every faster AdamW kernel (SIMD CPU, CUDA)
// must match bit for bit. The operation order is fixed and FMAs are explicit, so the
// same IEEE operations can be reproduced exactly on any device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/offload/update_types.h"

namespace tandem {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// Everything the per-element update needs, computed once per step and tensor class
// (host side, in double, then rounded once to float), so that all kernels share
// exactly the same float constants.
struct AdamWStepScalars {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float decay_factor;  // 1 - lr * weight_decay, or 1 for tensors without decay
  float grad_scale;    // gradient clipping factor (1 when not clipping)
};

// step is 1-based (the bias corrections use beta^step).
AdamWStepScalars adamw_step_scalars(const AdamWHyper& hyper, int64_t step, bool weight_decay,
                                    float grad_scale);

// The arrays one AdamW update touches; element i of each belongs to parameter i.
struct AdamWArrays {
  float* params = nullptr;  // fp32 master weights, updated in place
  float* m = nullptr;       // first moment, updated in place
  float* v = nullptr;       // second moment, updated in place
  const void* grads = nullptr;
  GradDType grad_dtype = GradDType::kF32;
  void* params16 = nullptr;  // written when params16_dtype != kNone
  WorkingDType params16_dtype = WorkingDType::kNone;

  // The same arrays starting at element `offset`.
  AdamWArrays slice(size_t offset) const;
};

// For each i:
//   g    = float(grad[i]) * grad_scale
//   m    = fma(beta1, m, (1 - beta1) * g)
//   v    = fma(beta2, v, ((1 - beta2) * g) * g)
//   p    = fma(-step_size, m / fma(sqrt(v), inv_sqrt_bc2, eps), p * decay_factor)
//   p16  = round_to_nearest_even(p)          (bf16 or fp16; NaN stays NaN)
void adamw_reference(const AdamWArrays& arrays, size_t n, const AdamWStepScalars& s);

// fp32 gradients, no working copy.
inline void adamw_reference(float* params, const float* grads, float* m, float* v, size_t n,
                            const AdamWStepScalars& s) {
  AdamWArrays arrays;
  arrays.params = params;
  arrays.m = m;
  arrays.v = v;
  arrays.grads = grads;
  adamw_reference(arrays, n, s);
}

}  // namespace tandem
