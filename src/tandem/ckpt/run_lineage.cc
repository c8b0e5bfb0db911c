#include "tandem/ckpt/run_lineage.h"

#include <random>

#include "tandem/comm/communicator.h"
#include "tandem/core/checksum.h"

namespace tandem {

void RunLineage::agree_on_token(Communicator& comm) {
  if (comm.rank() == 0) {
    std::random_device entropy;
    token_ = (uint64_t{entropy()} << 32) ^ entropy();
  }
  comm.broadcast(&token_, sizeof token_, 0);
}

void RunLineage::continue_from(const CheckpointLineage& resumed) {
  resumed_.clear();
  if (resumed.id.empty()) return;  // written before tandem recorded lineages
  resumed_.push_back(resumed.id);
  resumed_.insert(resumed_.end(), resumed.ancestors.begin(), resumed.ancestors.end());
}

std::string RunLineage::id_of(int64_t step) const {
  const uint64_t words[2] = {token_, static_cast<uint64_t>(step)};
  return checksum_hex(checksum64(words, sizeof words));
}

CheckpointLineage RunLineage::at(int64_t step) const {
  CheckpointLineage lineage;
  lineage.id = id_of(step);
  for (auto begun = steps_.rbegin(); begun != steps_.rend(); ++begun)
    if (*begun != step) lineage.ancestors.push_back(id_of(*begun));
  lineage.ancestors.insert(lineage.ancestors.end(), resumed_.begin(), resumed_.end());
  constexpr size_t kMaxAncestors = 1000;  // a long run's history, bounded
  if (lineage.ancestors.size() > kMaxAncestors) lineage.ancestors.resize(kMaxAncestors);
  return lineage;
}

}  // namespace tandem
