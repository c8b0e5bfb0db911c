#include "tandem/optim/adamw.h"

#include "tandem/core/error.h"

namespace tandem {

AdamW::AdamW(const ParamLayout& layout, const AdamWHyper& hyper)
    : layout_(layout),
      hyper_(hyper),
      m_(layout.num_elements(), 0.0f),
      v_(layout.num_elements(), 0.0f) {}

void AdamW::step(float* params, const float* grads, float lr, float grad_scale) {
  step_++;
  AdamWHyper hyper = hyper_;
  hyper.lr = lr;
  const AdamWStepScalars with_decay = adamw_step_scalars(hyper, step_, true, grad_scale);
  const AdamWStepScalars without_decay = adamw_step_scalars(hyper, step_, false, grad_scale);
  for (const ParamView& view : layout_.views()) {
    const size_t o = view.offset;
    adamw_reference(params + o, grads + o, m_.data() + o, v_.data() + o, view.numel,
                    view.weight_decay ? with_decay : without_decay);
  }
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
