// How ZeRO cuts the flat parameter space over the ranks: padded to world_size equal
// contiguous partitions, rank r owning [r S, (r + 1) S) clipped to the parameters. Each
// rank cuts its own partition into offload subgroups (offload/offload_plan.h).
//
// S is a multiple of kPartitionAlignment, the block of the gradient-norm sum
// (compute/cpu/sum_of_squares.h): a partition then holds whole blocks, its blocks' partial sums are
// the full buffer's, and the norm over partitioned gradients is bit-identical to the norm
// over all of them.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "tandem/offload/offload_plan.h"

namespace tandem {

class ZeroPartition {
 public:
  static constexpr size_t kPartitionAlignment = size_t{1} << 14;

  ZeroPartition(size_t num_params, int world_size);

  size_t num_params() const { return num_params_; }
  int world_size() const { return world_size_; }
  // S: the parameters of every partition, padding included.
  size_t partition_size() const { return partition_size_; }
  // world_size x S: the padded flat space.
  size_t padded_size() const { return partition_size_ * world_size_; }
  // The real parameters of rank r (the last ranks' may be short or empty).
  ParamRange range(int rank) const;
  // The rank whose partition holds parameter `index`.
  int owner(size_t index) const { return static_cast<int>(index / partition_size_); }

 private:
  size_t num_params_;
  int world_size_;
  size_t partition_size_;
};

// The sizes of the two largest of the blocks with more than `above` parameters (0 where
// there are fewer): stages 2 and 3 hold at most two blocks' gradients or gathered
// parameters at once (model/block_memory.h), so this is what their buffers must fit.
std::pair<size_t, size_t> two_largest_blocks(const std::vector<ParamRange>& blocks,
                                             size_t above = 0);

}  // namespace tandem
