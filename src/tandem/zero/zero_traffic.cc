#include "tandem/zero/zero_traffic.h"

#include "tandem/core/error.h"
#include "tandem/zero/partition.h"

namespace tandem {

ZeroStepTraffic zero_step_traffic(int stage, size_t num_params, int world_size,
                                  size_t grad_elem_bytes, size_t param_elem_bytes) {
  TANDEM_CHECK(stage >= 0 && stage <= 3, "zero_optimization.stage ", stage, " is not 0 to 3");
  ZeroStepTraffic t;
  if (world_size <= 1) return t;
  const double N = world_size, P = static_cast<double>(num_params);
  const double ring_grads = (N - 1) / N * P * static_cast<double>(grad_elem_bytes);
  const double ring_params = (N - 1) / N * P * static_cast<double>(param_elem_bytes);
  const double gather_partitions =
      (N - 1) * static_cast<double>(ZeroPartition(num_params, world_size).partition_size()) *
      static_cast<double>(param_elem_bytes);
  switch (stage) {
    case 0:
      t.last_backward = 2 * ring_grads;
      break;
    case 1:
      t.last_backward = ring_grads;
      t.after_update = gather_partitions;
      break;
    case 2:
      t.backward_per_micro_batch = ring_grads;
      t.after_update = gather_partitions;
      break;
    case 3:
      t.forward_per_micro_batch = ring_params;
      t.backward_per_micro_batch = ring_params + ring_grads;
      break;
  }
  return t;
}

}  // namespace tandem
