// The named points of a training step, where systems that are not the model attach:
// data parallelism (zero/), an optimizer's collective phase (DeMo), asynchronous
// checkpoints. The trainer calls every registered hook at each point, in registration
// order; data parallelism is itself one of them.
//
//   for each micro-batch: forward, backward
//     the last micro-batch's backward, block by block:    gradients_final(begin, end)
//   all gradients final (and reduced):                     before_update(step)
//   optimizer update
//   after the update:                                      after_update(step)
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // This rank's gradients [begin, end) of the step are final: its micro-batches summed
  // (ranges of one step never overlap and together cover every parameter). Called as
  // backward finishes each block (the last micro-batch's), so work can start early.
  virtual void gradients_final(size_t begin, size_t end) {
    (void)begin;
    (void)end;
  }
  // Every gradients_final of optimizer step `step` (1-based) has been called; the
  // gradient norm and the update come next.
  virtual void before_update(int64_t step) { (void)step; }
  // The update of `step` is done (this rank's parameters are new).
  virtual void after_update(int64_t step) { (void)step; }
};

}  // namespace tandem
