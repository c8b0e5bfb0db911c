// "zero_optimization": how data parallelism partitions the training state over the ranks,
// with DeepSpeed's key names and meanings (ZeRO, arXiv 1910.02054):
//   stage 0: gradients all-reduced; every rank holds the full optimizer state.
//   stage 1: fp32 master weights, m and v partitioned; gradients reduced to their
//            partition's owner after backward; each rank updates its partition and the
//            new working parameters are all-gathered.
//   stage 2: as 1, with the gradients reduced in buckets during backward as blocks
//            finish when overlap_comm is on (the gradient buffer itself is not
//            partitioned yet).
//   stage 3: parameters partitioned too (not implemented yet: refused at start).
// Sizes are in elements (parameters), as in DeepSpeed.
#pragma once

#include <cstddef>

namespace tandem {

struct ZeroConfig {
  int stage = 0;
  bool overlap_comm = true;          // reduce gradient buckets during backward
  bool contiguous_gradients = true;  // gradients live in one flat buffer (always, in tandem)
  size_t reduce_bucket_size = 500'000'000;
  size_t allgather_bucket_size = 500'000'000;
  size_t stage3_prefetch_bucket_size = 50'000'000;
  size_t stage3_param_persistence_threshold = 100'000;
  size_t stage3_max_live_parameters = 1'000'000'000;
  bool operator==(const ZeroConfig&) const = default;
};

}  // namespace tandem
