// `tandem bench checkpoint --config F`: the same training run three times in one process,
// with synchronous checkpoints, lazy ones from a full copy of the state, and lazy ones
// streamed through a bounded pool (--pool-mb; train.checkpoint_memory_mb), and what each
// checkpoint cost the training loop: its stall (milliseconds the loop was blocked) as a
// fraction of a step, next to its flush time. The run's last checkpoint is synchronous in both
// modes (no next step to hide behind) and is left out. The goal: a lazy checkpoint's stall
// at most 5% of a step whenever its flush fits before the next checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/config/train_config.h"

namespace tandem {

struct CheckpointBenchOptions {
  TrainConfig config;    // output_dir is replaced by a scratch directory
  int64_t steps = 30;    // per mode
  int64_t interval = 5;  // a checkpoint every `interval` steps
  // The streamed mode's pool in MiB; 0: an eighth of the state, at least 1 MiB.
  int64_t pool_mb = 0;
};

struct CheckpointModeResult {
  std::string name;  // "synchronous", "lazy", "streamed"
  bool lazy = false;
  uint64_t pool_bytes = 0;  // streamed: the pool's size
  int64_t checkpoints = 0;  // measured (the last one left out)
  double step_ms = 0;       // median over the run's steps
  double stall_ms_mean = 0, stall_ms_max = 0;
  double flush_ms_mean = 0;
  double stall_per_step = 0;  // stall_ms_mean / step_ms
  // The flush ends before the next checkpoint step begins (interval steps later).
  bool flush_fits = false;
};

struct CheckpointBenchResult {
  int64_t params = 0;
  uint64_t checkpoint_bytes = 0;  // on disk, one checkpoint
  int64_t steps = 0, interval = 0;
  CheckpointModeResult sync, lazy, streamed;

  nlohmann::json to_json() const;
  std::string to_text() const;
};

CheckpointBenchResult run_checkpoint_bench(const CheckpointBenchOptions& options);

}  // namespace tandem
