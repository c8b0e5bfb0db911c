// The lineage of the checkpoints one invocation of a run writes (ckpt/checkpoint_dir.h,
// CheckpointLineage): each checkpoint's id, from a token of the invocation and its step,
// and the ids of its timeline's earlier checkpoints, newest first (those begun before it in
// this invocation, then the resumed checkpoint's and its ancestors). --resume of a run
// directory follows it to the newest checkpoint of latest's timeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/ckpt/checkpoint_dir.h"

namespace tandem {

class Communicator;

class RunLineage {
 public:
  // Draws the invocation's token on rank 0 and gives it to every rank (a collective), so
  // that all ranks name a checkpoint alike.
  void agree_on_token(Communicator& comm);
  // The checkpoints written from here on continue `resumed`'s timeline.
  void continue_from(const CheckpointLineage& resumed);
  // A checkpoint of `step` was begun: an ancestor of the later ones.
  void begun_at(int64_t step) { steps_.push_back(step); }
  // The lineage of this invocation's checkpoint of `step` (the same for every call).
  CheckpointLineage at(int64_t step) const;

 private:
  std::string id_of(int64_t step) const;

  uint64_t token_ = 0;
  std::vector<int64_t> steps_;
  std::vector<std::string> resumed_;  // the resumed checkpoint's id and its ancestors
};

}  // namespace tandem
