#include "tandem/train/checkpointer.h"

#include <system_error>
#include <utility>

#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/timer.h"
#include "tandem/offload/update_engine.h"

namespace tandem {
namespace fs = std::filesystem;

Checkpointer::Checkpointer(const TrainConfig& config, UpdateEngine& engine, fs::path root, int rank,
                           int world_size, bool lazy)
    : config_(config),
      engine_(engine),
      root_(std::move(root)),
      rank_(rank),
      world_size_(world_size) {
  if (!lazy) return;
  TANDEM_CHECK(world_size_ == 1, "lazy checkpoints take one rank");
  const size_t P = engine_.plan().num_params;
  snapshot_.params.assign(P, 0.0f);
  snapshot_.optimizer_state.assign(engine_.rule().state_floats() - 1, std::vector<float>(P, 0.0f));
}

Checkpointer::~Checkpointer() {
  try {
    engine_.finish_capture();
  } catch (const Error&) {
    // The step that failed reported it; the snapshot is dropped.
  }
}

void Checkpointer::begin_lazy(TrainingState state) {
  TANDEM_CHECK(world_size_ == 1, "lazy checkpoints take one rank");
  TANDEM_CHECK(!capturing_step_, "checkpoint ", state.step, ": the snapshot of step ",
               *capturing_step_, " is still being taken");
  Stopwatch watch;
  wait_for_write_in_flight();
  // The arrays keep their memory from the last snapshot.
  std::vector<float> params = std::move(snapshot_.params);
  std::vector<std::vector<float>> optimizer_state = std::move(snapshot_.optimizer_state);
  snapshot_ = std::move(state);
  const size_t P = engine_.plan().num_params, arrays = engine_.rule().state_floats();
  params.resize(P);
  optimizer_state.resize(arrays - 1);
  for (std::vector<float>& array : optimizer_state) array.resize(P);
  snapshot_.params = std::move(params);
  snapshot_.optimizer_state = std::move(optimizer_state);
  std::vector<float*> targets = {snapshot_.params.data()};
  for (std::vector<float>& array : snapshot_.optimizer_state) targets.push_back(array.data());
  Event& landed = engine_.begin_capture(targets);
  capturing_step_ = snapshot_.step;
  pending_stall_ms_ = watch.millis();
  // The write starts as soon as the copies have landed (usually during the next forward
  // and backward), not after the next update: the flush gets the whole interval.
  writer_.start(snapshot_.step, [this, &landed] {
    landed.synchronize();
    return write(snapshot_);
  });
}

void Checkpointer::after_step(const UpdateStepStats& stats) {
  if (!capturing_step_) return;
  pending_stall_ms_ += stats.capture_wait_ms + engine_.finish_capture();
  capturing_step_.reset();
}

void Checkpointer::save_now(int64_t step, const std::function<fs::path()>& save) {
  Stopwatch watch;
  wait_for_write_in_flight();
  BackgroundCheckpointWriter::Outcome outcome{.step = step};
  Stopwatch flush;
  try {
    outcome.path = save();
    if (rank_ == 0) prune_checkpoints(root_, config_.train.keep_checkpoints);
  } catch (const Error& e) {
    if (world_size_ > 1) throw;  // collective saves fail on every rank together
    outcome.error = e.what();
  }
  outcome.flush_ms = flush.millis();
  pending_stall_ms_ = watch.millis();
  CheckpointRecord record = finished(outcome);
  record.lazy = false;
  done_.push_back(std::move(record));
}

std::vector<CheckpointRecord> Checkpointer::collect(bool wait) {
  if (wait) {
    TANDEM_CHECK(!capturing_step_, "checkpoint ", *capturing_step_,
                 ": collect(wait) before the step that completes its snapshot");
    wait_for_write_in_flight();
  } else if (capturing_step_) {
    // Its stall is not complete until after_step: collected later.
  } else if (std::optional<BackgroundCheckpointWriter::Outcome> outcome = writer_.poll()) {
    done_.push_back(finished(*outcome));
  }
  std::vector<CheckpointRecord> out = std::exchange(done_, {});
  for (const CheckpointRecord& record : out)
    if (!record.error.empty() && config_.train.checkpoint_failure == CheckpointFailure::kStop)
      fail(record.error, " (train.checkpoint_failure = \"continue\" would note this and train on)");
  return out;
}

CheckpointRecord Checkpointer::finished(const BackgroundCheckpointWriter::Outcome& outcome) {
  CheckpointRecord record{.step = outcome.step,
                          .path = outcome.path,
                          .lazy = true,
                          .stall_ms = pending_stall_ms_,
                          .flush_ms = outcome.flush_ms};
  pending_stall_ms_ = 0;
  if (!outcome.error.empty()) {
    std::error_code ec;
    const fs::space_info space = fs::space(root_, ec);
    record.error =
        cat("the checkpoint of step ", outcome.step, " failed: ", outcome.error,
            "; it needs about ", format_bytes(checkpoint_bytes()),
            ec ? std::string()
               : cat(" and ", root_.string(), " has ", format_bytes(space.available), " free"),
            "; the previous checkpoint is intact and 'latest' still names it");
  }
  return record;
}

double Checkpointer::wait_for_write_in_flight() {
  Stopwatch watch;
  if (std::optional<BackgroundCheckpointWriter::Outcome> outcome = writer_.wait())
    done_.push_back(finished(*outcome));
  return watch.millis();
}

uint64_t Checkpointer::checkpoint_bytes() const {
  return static_cast<uint64_t>(engine_.plan().num_params) * engine_.rule().state_floats() *
         sizeof(float);
}

fs::path Checkpointer::write(const TrainingState& state) const {
  const fs::path path = save_training_checkpoint(root_, state);
  prune_checkpoints(root_, config_.train.keep_checkpoints);
  return path;
}

}  // namespace tandem
