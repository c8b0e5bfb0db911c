// The named points of a training run, where systems that are not the model attach: data
// parallelism (zero/), an optimizer's own checks (DeMo's), the run's checkpoints
// (ckpt/run_checkpoints.h). The trainer calls every registered hook at each point, in
// registration order; data parallelism is itself one of them. The hooks are the only door
// into the loop: a system that needs a point gets one here, not a call in the trainer.
//
//   for each optimizer step (an attempt):
//     for each micro-batch: forward, backward
//       the last micro-batch's backward, block by block:  gradients_final(begin, end)
//     all gradients final (and reduced):                   before_update(step)
//     optimizer update (or a skip: a non-finite loss)
//     after the update:                                    after_update(step)
//     the attempt is over, updated or skipped:             step_attempted(step)
//   a step counted, its figures and evaluation done:       step_finished(step, last)
//   the run stops with an error:                           stopping_on_error()
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
  // The attempt at `step` is over, whether it updated or was skipped (its loss or gradient
  // norm not finite: the step is attempted again with the next batch).
  virtual void step_attempted(int64_t step) { (void)step; }
  // `step` is done and recorded (and evaluated when due); `last`: the run ends with it (its
  // last step, or a stop request).
  virtual void step_finished(int64_t step, bool last) {
    (void)step;
    (void)last;
  }
  // The run is about to stop with an error: finish what must not be lost.
  virtual void stopping_on_error() {}
};

}  // namespace tandem
