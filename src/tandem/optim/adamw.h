// AdamW over the flat parameter space, with the state (m, v) in host memory, updated
// by the multi-threaded SIMD CPU kernel.
// Decoupled weight decay applies to the tensors the layout marks (2-D weights).
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/model/param_layout.h"
#include "tandem/optim/adamw_reference.h"
#include "tandem/optim/cpu_adamw.h"

namespace tandem {

class AdamW {
 public:
  // The update runs on `pool` with the best SIMD kernel of this CPU (or `target`).
  AdamW(const ParamLayout& layout, const AdamWHyper& hyper, ThreadPool& pool,
        SimdTarget target = best_simd_target());

  // One update of host params from host grads with learning rate lr (the schedule's
  // value for this step) and gradient scale grad_scale (clipping). Advances step().
  void step(float* params, const float* grads, float lr, float grad_scale);

  int64_t step_count() const { return step_; }
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  // Restores state from a checkpoint.
  void set_state(int64_t step, std::vector<float> m, std::vector<float> v);

 private:
  const ParamLayout& layout_;
  AdamWHyper hyper_;
  CpuAdamW kernel_;
  std::vector<AdamWSegment> segments_;
  int64_t step_ = 0;
  std::vector<float> m_;
  std::vector<float> v_;
};

}  // namespace tandem
