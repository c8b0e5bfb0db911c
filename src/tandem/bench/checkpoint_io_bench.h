// `tandem bench checkpoint-io --config F`: a checkpoint's synchronous save and the resume's
// read of it, alone (no training): the state of F's model (params and optimizer state,
// random, finite), saved as a run's checkpoint (save_training_checkpoint: the files, their
// checksums, fsync, the renames) and read back as a resume reads it
// (load_training_checkpoint: checksums verified first) and as a resume streams it into the
// update engine of a run on the cpu device (stream_training_arrays, bounded memory),
// --rounds times in alternation, each round into a fresh directory under --dir. The bytes of one
// checkpoint, the median of each side's milliseconds and their GB/s. bench/checkpoint_vs_pytorch.sh
// sets torch.save + fsync and torch.load of the same arrays beside it, in the same directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tandem/config/train_config.h"

namespace tandem {

struct CheckpointIoBenchOptions {
  TrainConfig config;
  // Where the checkpoints go (a directory of the bench's own is made inside and removed);
  // empty: the system's temporary directory. Name the disk being measured.
  std::filesystem::path dir;
  int rounds = 5;
};

struct CheckpointIoBenchResult {
  int64_t params = 0;
  uint64_t checkpoint_bytes = 0;  // every file of one checkpoint, manifest included
  uint64_t array_bytes = 0;       // the fp32 arrays alone (params and optimizer state)
  std::filesystem::path dir;      // where they were written
  // The model's tensors (tandem layout), for a peer that saves the same arrays.
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  std::vector<std::string> optimizer_arrays;  // OptimizerFamily::state_names
  std::vector<double> save_ms, load_ms, resume_ms;
  double save_ms_median = 0, load_ms_median = 0, resume_ms_median = 0;

  // One checkpoint's bytes over `ms` milliseconds, in GB/s (0 for no time).
  double gb_per_s(double ms) const { return ms > 0 ? checkpoint_bytes / ms / 1e6 : 0.0; }

  nlohmann::json to_json() const;
  std::string to_text() const;
};

CheckpointIoBenchResult run_checkpoint_io_bench(const CheckpointIoBenchOptions& options);

}  // namespace tandem
