// `tandem bench offload`: one config trained under several update schedules in one process
// (cpu, interleave, auto, device, ...), each from the same initialisation on the same
// batches, measured side by side: tokens/s, forward / backward / update ms, the performance
// model's predicted update time against the measured one, the memory each tier holds, the
// losses and the state digest, which must be the same for every schedule (they compute the
// same bits). A schedule whose plan does not fit the device is reported, not run.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/config/step_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/offload/offload_plan.h"
#include "tandem/train/trainer.h"

namespace tandem {

// Medians of a run's steps after the first `warmup` (robust to a noisy neighbour).
// update_ms is each update's whole time: with offload_optimizer.overlap_forward, its time in
// the step plus the time it ran on into the next (StepRecord::update_hidden_ms and
// update_wait_ms, so the last step's is not known); update_exposed_ms the part of it the
// steps waited for.
struct StepMedians {
  double tokens_per_s = 0, ms = 0, forward_ms = 0, backward_ms = 0, update_ms = 0;
  double update_exposed_ms = 0;
};
StepMedians step_medians(const TrainResult& result, int warmup);
// `config` trained as every benchmark trains it: `warmup` + `steps` steps, no evaluation, no
// sample, no checkpoint, nothing printed.
// Over `world_size` in-process ranks (threads of this process, sharing its CPUs), rank 0's
// result.
TrainResult train_for_bench(TrainConfig config, int warmup, int steps, int world_size = 1);

struct OffloadBenchOptions {
  TrainConfig config;  // train.steps, eval and samples are set by the bench
  std::vector<UpdateSchedule> schedules = {UpdateSchedule::kCpu, UpdateSchedule::kInterleave,
                                           UpdateSchedule::kAuto};
  int steps = 10;  // timed steps per schedule
  int warmup = 3;  // steps run first and not timed
  // Told of each schedule before it runs; may be empty.
  std::function<void(const std::string&)> progress;
};

struct OffloadBenchCase {
  UpdateSchedule schedule = UpdateSchedule::kCpu;
  // The micro-batch, accumulation and recompute it trained with: the config's, or the step
  // planner's choice for its "auto" ones under this schedule (config/step_plan.h).
  StepSettings settings;
  std::string error;  // why it did not run (its plan does not fit); empty when it ran
  StepMedians medians;
  double predicted_update_ms = 0;
  // With offload_optimizer.overlap_forward: the prediction less what the performance model
  // predicts the next forward hides of it (predict_hidden_update, from the measured forward
  // less its waits), against StepMedians::update_exposed_ms. The whole prediction without.
  double predicted_exposed_update_ms = 0;
  TrainingMemoryPlan plan;
  size_t device_bytes_in_use = 0;
  std::string state_digest;
  std::vector<double> losses;
};

struct OffloadBenchResult {
  std::vector<OffloadBenchCase> cases;
  size_t params = 0;
  int batch = 0, seq_len = 0,
      timed_steps = 0;  // batch: the config's micro-batch (kAuto: chosen per run)
  std::string device;
  size_t schedules_run() const;
  // Every schedule that ran ended with the same state digest.
  bool digests_agree() const;
  // auto's measured update time over the fastest fixed schedule's that ran (0: either is
  // missing).
  double auto_to_best_fixed_update() const;
  std::string to_text() const;
  nlohmann::json to_json() const;
};

OffloadBenchResult run_offload_bench(const OffloadBenchOptions& options);

}  // namespace tandem
