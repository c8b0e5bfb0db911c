// What a run tells as it goes, one call per event of the loop: the metrics file for
// programs (JSON Lines, metrics_log.h) and the progress line and notes for people
// (progress.h). Only rank 0 reports; the others' have no metrics path and no progress.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/ckpt/checkpoint_record.h"
#include "tandem/config/memory_plan.h"
#include "tandem/train/metrics_log.h"
#include "tandem/train/progress.h"
#include "tandem/train/step_record.h"

namespace tandem {

class RunReport {
 public:
  RunReport(std::filesystem::path metrics_path, int64_t total_steps, int64_t log_interval,
            bool show_progress);

  // A line of its own for people (the plan, a resume, a warning).
  void note(const std::string& text) { progress_.note(text); }
  // The update plan, indented under a heading naming the device.
  void note_plan(const TrainingMemoryPlan& plan, std::string_view device_name);
  // What is about to train: the model, the optimizer, the data (`tokens`, in epochs of
  // `batches_per_epoch`), and the ranks.
  void announce(const TrainConfig& config, size_t tokens, uint64_t batches_per_epoch,
                int world_size, std::string_view backend);
  // Opens the metrics file at `step` with what this rank holds per tier under `plan`
  // (allocated up front: the peak of the run); a run resumed from `resumed` cuts the
  // records of the steps it is about to redo and says where it resumed.
  void start(int64_t step, const std::filesystem::path& resumed, const TrainingMemoryPlan& plan);
  // An attempt whose loss or gradient norm was not finite: the step it would have been.
  void skipped(int64_t step, const StepRecord& figures, int64_t in_a_row);
  // A step done: `line` is its metrics record (step_metrics and what the trainer adds).
  void step(const StepRecord& record, const nlohmann::json& line);
  void val_loss(int64_t step, float loss);
  // A checkpoint committed, or failed under train.checkpoint_failure "continue".
  void checkpoint(const CheckpointRecord& record);
  // Ends the live progress line.
  void end_progress() { progress_.finish(); }
  // The run's last record.
  void finish(int64_t step, const nlohmann::json& summary);

 private:
  std::filesystem::path metrics_path_;
  ProgressLine progress_;
  std::optional<MetricsLog> metrics_;  // from start()
};

}  // namespace tandem
