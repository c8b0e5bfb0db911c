#include "tandem/optim/adamw.h"

#include "tandem/core/error.h"

namespace tandem {

AdamW::AdamW(const ParamLayout& layout, const AdamWHyper& hyper, ThreadPool& pool,
             SimdTarget target)
    : layout_(layout),
      hyper_(hyper),
      kernel_(pool, target),
      segments_(adamw_segments(layout)),
      m_(layout.num_elements(), 0.0f),
      v_(layout.num_elements(), 0.0f) {}

void AdamW::step(float* params, const float* grads, float lr, float grad_scale) {
  step_++;
  AdamWHyper hyper = hyper_;
  hyper.lr = lr;
  const AdamWStepScalars with_decay = adamw_step_scalars(hyper, step_, true, grad_scale);
  const AdamWStepScalars without_decay = adamw_step_scalars(hyper, step_, false, grad_scale);
  kernel_.update(AdamWArrays{.params = params, .m = m_.data(), .v = v_.data(), .grads = grads},
                 segments_, with_decay, without_decay);
}

void AdamW::set_state(int64_t step, std::vector<float> m, std::vector<float> v) {
  TANDEM_CHECK(m.size() == layout_.num_elements() && v.size() == layout_.num_elements(),
               "optimizer state has ", m.size(), "/", v.size(), " elements, the model has ",
               layout_.num_elements());
  step_ = step;
  m_ = std::move(m);
  v_ = std::move(v);
}

}  // namespace tandem
