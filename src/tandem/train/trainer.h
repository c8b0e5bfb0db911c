// The training loop: data, model, optimizer, schedule, evaluation, checkpoints,
// metrics and progress, for one run configuration.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "tandem/ckpt/checkpoint_record.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/train/step_record.h"

namespace tandem {
class Communicator;
class StepHooks;
}  // namespace tandem

namespace tandem {

struct TrainOptions {
  std::filesystem::path resume;  // a checkpoint (any form resolve_checkpoint takes)
  // With `resume`: write into the run directory the checkpoint belongs to
  // (ckpt/resume_check.h, run_directory_of) instead of train.output_dir, as `tandem train
  // --resume` does unless --set train.output_dir is given. Either way a resumed run refuses
  // an output directory that holds another run's checkpoints.
  bool continue_in_resumed_run = false;
  // With `resume`: go on although the config differs from the checkpoint's run in a way
  // that changes the numbers (resume_mismatches), giving up bit-exact continuation; the
  // differences are printed. False: such a resume is refused, naming them.
  bool allow_inexact_resume = false;
  // Train although the plan takes more host memory than the machine has (pinned state,
  // snapshots, the cpu device's memory); false: such a run is refused before it allocates,
  // naming the figures.
  bool allow_host_overcommit = false;
  std::filesystem::path metrics_path;  // JSON Lines; empty for none
  // Stop (with a checkpoint) once this many steps are done, though the schedule spans
  // train.steps; 0 runs to train.steps. For time-sliced jobs and the resume test.
  int64_t stop_at_step = 0;
  bool show_progress = true;     // progress line and notes on stderr
  bool save_checkpoints = true;  // false: nothing is written under train.output_dir (benchmarks)
  // A Chrome trace of steps [trace_first_step, trace_last_step] (1-based, inclusive):
  // forward/backward, the update, CPU updates and every copy and device kernel per
  // subgroup. Empty: no trace.
  std::filesystem::path trace_path;
  int64_t trace_first_step = 2;
  int64_t trace_last_step = 3;
  // Polled at every step boundary: a signal number asks the run to stop there with a
  // checkpoint (core/stop_signals.h); 0 carries on. With several ranks, a signal on any
  // rank stops them all at the same step. Empty: never asked.
  std::function<int()> stop_requested;
  // Test injection: the step attempts (1-based, counted in this invocation, skipped ones
  // included) whose backward runs with a NaN loss scale, so that every gradient is NaN.
  std::set<int64_t> nan_gradient_attempts;
  // Test injection: the cpu device's copy faults and slowness (device/device.h).
  CpuDeviceOptions cpu_device_injection;
  // Called at the named points of every step (step_hooks.h), after data parallelism's
  // own; not owned, must outlive train().
  std::vector<StepHooks*> hooks;
};

struct TrainResult {
  std::vector<StepRecord> steps;  // every step of this invocation
  int64_t steps_done = 0;
  float last_train_loss = 0.0f;
  float last_val_loss = 0.0f;  // NaN when no evaluation ran
  std::filesystem::path last_checkpoint;
  std::filesystem::path output_dir;  // where the run wrote (train.output_dir, or the resumed run's)
  std::vector<CheckpointRecord> checkpoints;  // committed (or failed) in this invocation
  int64_t skipped_steps = 0;  // attempts skipped for a non-finite loss or gradient norm
  int stopped_by_signal = 0;  // the signal that stopped the run early (stop_requested), or 0
  std::string sample;         // bytes sampled at the end (train.sample_bytes)
  std::string state_digest;   // XXH3-64 of the final params, m and v (hex)
  // ZeRO stage 3: the most gathered parameters this rank held at once (at most
  // zero_optimization.stage3_max_live_parameters); 0 below stage 3.
  size_t peak_live_parameters = 0;
  // What this rank trained under: the update plan, its bytes per tier, the measured rates
  // and the predicted update time.
  TrainingMemoryPlan plan;
  // Device memory this rank's run held at the end (all of it is allocated up front).
  size_t device_bytes_in_use = 0;
};

// One process, world size 1.
TrainResult train(const TrainConfig& config, const TrainOptions& options);
// One rank of a data-parallel run over `comm` (every rank calls it with the same config):
// each rank trains on its slice of every global batch (micro-batch x accumulation x
// world size) with zero_optimization.stage deciding what it holds. Rank 0 alone prints,
// writes metrics, checkpoints and samples; the state digest and losses are the same on
// every rank. An error on a rank is thrown there, naming the rank.
// `buffer_comm`: the communicator of the model's gradient and parameter buffers, of the same
// ranks as `comm`; null: `comm` on the cpu device, NCCL (made over `comm`) on the cuda device.
TrainResult train(const TrainConfig& config, const TrainOptions& options, Communicator& comm,
                  Communicator* buffer_comm = nullptr);

}  // namespace tandem
