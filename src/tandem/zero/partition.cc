#include "tandem/zero/partition.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem {

ZeroPartition::ZeroPartition(size_t num_params, int world_size)
    : num_params_(num_params), world_size_(world_size) {
  TANDEM_CHECK(world_size >= 1, "a ZeRO partition needs at least 1 rank, got ", world_size);
  const size_t per_rank = (num_params + world_size - 1) / world_size;
  partition_size_ =
      std::max<size_t>(1, (per_rank + kPartitionAlignment - 1) / kPartitionAlignment) *
      kPartitionAlignment;
}

std::pair<size_t, size_t> two_largest_blocks(const std::vector<ParamRange>& blocks, size_t above) {
  size_t largest = 0, second = 0;
  for (const ParamRange& b : blocks) {
    if (b.size() <= above) continue;
    if (b.size() > largest) {
      second = largest;
      largest = b.size();
    } else {
      second = std::max(second, b.size());
    }
  }
  return {largest, second};
}

ParamRange ZeroPartition::range(int rank) const {
  TANDEM_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is not in a world of ",
               world_size_);
  const size_t begin = std::min(num_params_, static_cast<size_t>(rank) * partition_size_);
  return {begin, std::min(num_params_, begin + partition_size_)};
}

}  // namespace tandem
