// The bytes one rank sends per optimizer step at each ZeRO stage, counted as
// Communicator::traffic() counts them (a ring's volumes), and split by where in the step
// they move, so that the step planner (config/step_plan.h) can say how much of them the
// compute beside them hides. For P parameters over N ranks with partitions of S (padded),
// g bytes per gradient and w per working parameter:
//
//   stage 0  the last micro-batch's backward: all-reduce                2 (N-1)/N P g
//   stage 1  the last micro-batch's backward: reduce-scatter             (N-1)/N P g
//            after the update: all-gather of the working parameters      (N-1) S w
//   stage 2  every micro-batch's backward: each block reduced           (N-1)/N P g
//            after the update: as stage 1
//   stage 3  every micro-batch: gathers in forward and in backward     2 (N-1)/N P w
//            (an upper bound: blocks kept whole or still cached are not gathered again)
//            and its backward's reduction                              (N-1)/N P g
//
// Stages 0 and 1 accumulate the micro-batches' gradients and reduce once; stages 2 and 3
// hold no whole gradient buffer and reduce every micro-batch (data_parallel.h).
#pragma once

#include <cstddef>

namespace tandem {

struct ZeroStepTraffic {
  double forward_per_micro_batch = 0;   // beside each forward
  double backward_per_micro_batch = 0;  // beside each backward
  double last_backward = 0;             // beside the last micro-batch's backward
  double after_update = 0;              // after the update, beside nothing
  double total(int micro_batches) const {
    return micro_batches * (forward_per_micro_batch + backward_per_micro_batch) + last_backward +
           after_update;
  }
};

// The traffic of one rank of `world_size` per step (none with one rank).
ZeroStepTraffic zero_step_traffic(int stage, size_t num_params, int world_size,
                                  size_t grad_elem_bytes, size_t param_elem_bytes);

}  // namespace tandem
