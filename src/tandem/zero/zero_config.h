// "zero_optimization": how data parallelism partitions the training state over the ranks,
// with DeepSpeed's key names and meanings (ZeRO, arXiv 1910.02054):
//   stage 0: gradients all-reduced; every rank holds the full optimizer state.
//   stage 1: fp32 master weights, m and v partitioned; gradients reduced to their
//            partition's owner after backward; each rank updates its partition and the
//            new working parameters are all-gathered.
//   stage 2: gradients partitioned too: each block's are reduced to their owners as its
//            backward completes (every micro-batch), and no rank holds them all.
//   stage 3: parameters partitioned too: a block's are gathered from their owners before
//            its forward and its backward and released after; blocks of at most
//            stage3_param_persistence_threshold parameters are kept whole; at most
//            stage3_max_live_parameters gathered parameters are held at once, including
//            the next blocks prefetched (up to stage3_prefetch_bucket_size).
// Sizes are in elements (parameters), as in DeepSpeed.
#pragma once

#include <cstddef>

namespace tandem {

struct ZeroConfig {
  int stage = 0;
  // With several ranks, collectives on the model's buffers run on their own thread while
  // the rank computes (data_parallel.h).
  bool overlap_comm = true;
  bool contiguous_gradients = true;  // gradients live in one flat buffer (always, in tandem)
  size_t reduce_bucket_size = 500'000'000;
  size_t allgather_bucket_size = 500'000'000;
  size_t stage3_prefetch_bucket_size = 50'000'000;
  size_t stage3_param_persistence_threshold = 100'000;
  size_t stage3_max_live_parameters = 1'000'000'000;
  bool operator==(const ZeroConfig&) const = default;
};

}  // namespace tandem
