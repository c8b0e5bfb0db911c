// What a run reports of one checkpoint: where it went, how long the loop waited for it and
// how long writing it took (the metrics' "checkpoint" records; train/trainer.h's result).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem {

// One checkpoint of a run (also what --metrics records when it is committed).
struct CheckpointRecord {
  int64_t step = 0;
  std::filesystem::path path = {};  // empty when the write failed (error says why)
  bool lazy = false;
  // Milliseconds the training loop was blocked by this checkpoint: waiting for the
  // previous write, the snapshot's copies the next update waited for, or (synchronous)
  // the whole save.
  double stall_ms = 0;
  double flush_ms = 0;  // writing it, from the snapshot to the committed directory
  std::string error = {};
};

}  // namespace tandem
