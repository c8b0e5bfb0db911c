// `tandem bench versus`: what one setting costs or saves, as a ratio measured in one run. A
// config (the base) and the same config with a few settings changed (the variant) are
// trained in alternating rounds in one process, each from the same initialisation on the
// same batches, so that a noisy neighbour slows both alike; each side's figure is the
// median over its rounds of each round's median step. The settings measured this way
// (activation_checkpointing.interval, offload_optimizer.overlap_forward) change no number,
// so both sides must end with the same state digest; a setting that does (lr, seed) is named
// as the reason they differ.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/bench/offload_bench.h"
#include "tandem/config/train_config.h"

namespace tandem {

struct VersusBenchOptions {
  TrainConfig base;                  // train.steps, eval and samples are set by the bench
  TrainConfig variant;               // the base with the compared settings changed
  std::vector<std::string> changes;  // those settings, "key=value", for the report
  int rounds =
      3;  // each side trained this many times, alternating (base first, then variant first)
  int steps = 10;  // timed steps per run
  int warmup = 3;  // steps run first and not timed
  // Told of each run before it starts; may be empty.
  std::function<void(const std::string&)> progress;
};

struct VersusSide {
  StepMedians medians;  // medians over the rounds of each run's medians
  std::string state_digest;
  size_t device_bytes_in_use = 0;
  size_t planned_activation_bytes = 0;
};

struct VersusBenchResult {
  std::vector<std::string> changes;
  VersusSide base, variant;
  bool digests_agree = false;  // every run of both sides ended with one state digest
  // What of the variant's changes the numbers depend on (ckpt/resume_check.h's keys: lr, the
  // seed, the micro-batch ...): with any, the digests are expected to differ.
  std::vector<std::string> number_changes;
  // Digests that differ where no change explains it: a bug.
  bool digests_unexplained() const { return !digests_agree && number_changes.empty(); }
  size_t params = 0;
  int batch = 0, seq_len = 0, rounds = 0, timed_steps = 0;
  std::string device;
  // variant / base, for time per step (> 1: the variant is slower) and tokens/s.
  double ms_ratio() const;
  double tokens_per_s_ratio() const;
  std::string to_text() const;
  nlohmann::json to_json() const;
};

VersusBenchResult run_versus_bench(const VersusBenchOptions& options);

}  // namespace tandem
