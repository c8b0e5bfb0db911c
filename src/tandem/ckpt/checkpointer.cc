#include "tandem/ckpt/checkpointer.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "tandem/ckpt/streamed_checkpoint.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/timer.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace fs = std::filesystem;

Checkpointer::Checkpointer(const TrainConfig& config, UpdateEngine& engine, Device& device,
                           Communicator& comm, fs::path root, RankCheckpointLayout layout,
                           const CheckpointSnapshotPlan& snapshot, bool saves)
    : config_(config),
      engine_(engine),
      comm_(comm),
      root_(std::move(root)),
      layout_(std::move(layout)) {
  if (!saves) return;
  if (snapshot.streamed) {
    check_snapshot_pool(snapshot);
    streamed_ = true;
    // A rank with nothing to write (ZeRO stage 0: the others write rank 0's copy) takes
    // no snapshot.
    if (!several_ranks() || layout_.range.size() > 0 ||
        RankStreamedFiles::writes_params(layout_.zero_stage, comm_.rank()))
      pool_ =
          std::make_unique<SnapshotPool>(device, snapshot.pool_slots, snapshot.pool_slot_floats);
    return;
  }
  if (!config.train.lazy_checkpoints) return;
  const size_t P = engine_.plan().num_params;
  snapshot_.params.assign(P, 0.0f);
  snapshot_.optimizer_state.assign(engine_.rule().state_floats() - 1, std::vector<float>(P, 0.0f));
  if (device.kind() == DeviceKind::kCuda)
    pinned_ = device.allocate(MemorySpace::kPinnedHost,
                              engine_.rule().state_floats() * P * sizeof(float));
}

float* Checkpointer::capture_target(size_t k) {
  if (pinned_.data() != nullptr) return pinned_.as<float>() + k * engine_.plan().num_params;
  return k == 0 ? snapshot_.params.data() : snapshot_.optimizer_state[k - 1].data();
}

void Checkpointer::copy_out_of_pinned() {
  if (pinned_.data() == nullptr) return;
  const size_t P = engine_.plan().num_params;
  const float* from = pinned_.as<float>();
  std::copy(from, from + P, snapshot_.params.begin());
  for (size_t k = 0; k < snapshot_.optimizer_state.size(); k++)
    std::copy(from + (k + 1) * P, from + (k + 2) * P, snapshot_.optimizer_state[k].begin());
}

Checkpointer::~Checkpointer() {
  try {
    engine_.finish_capture();
  } catch (const Error&) {
    // The step that failed reported it; the snapshot is dropped.
  }
}

bool Checkpointer::several_ranks() const { return comm_.world_size() > 1; }

void Checkpointer::begin_lazy(TrainingState state) {
  TANDEM_CHECK(!capturing_step_, "checkpoint ", state.step, ": the snapshot of step ",
               *capturing_step_, " is still being taken");
  Stopwatch watch;
  finish_in_flight();
  if (streamed_) {
    // The writer takes the pieces as the capture's thread queues them: with several ranks
    // too (no parameters to gather), each rank into its files in rank 0's staging directory.
    if (several_ranks())
      staging_ =
          std::make_unique<ShardedStaging>(open_streamed_sharded_checkpoint(comm_, root_, state));
    snapshot_ = std::move(state);
    begin_streamed_capture();
    capturing_step_ = snapshot_.step;
    pending_stall_ms_ = watch.millis();
    writer_.start(snapshot_.step, [this] {
      if (!several_ranks()) return write_streamed(snapshot_);
      report_ = write_rank_streamed(*staging_);
      return fs::path();
    });
    return;
  }
  if (several_ranks())
    staging_ = std::make_unique<ShardedStaging>(open_sharded_checkpoint(comm_, root_, state.step));
  TANDEM_CHECK(snapshot_.params.size() == engine_.plan().num_params,
               "begin_lazy: the checkpointer was made without lazy checkpoints");
  // The trainer's fields are the state's; the arrays keep the memory allocated up front.
  state.params.swap(snapshot_.params);
  state.optimizer_state.swap(snapshot_.optimizer_state);
  snapshot_ = std::move(state);
  std::vector<float*> targets;
  for (size_t k = 0; k < engine_.rule().state_floats(); k++) targets.push_back(capture_target(k));
  Event& landed = engine_.begin_capture(targets);
  capturing_step_ = snapshot_.step;
  pending_stall_ms_ = watch.millis();
  if (several_ranks()) return;  // written after the next update (after_step)
  // One rank: the write starts as soon as the copies have landed (usually during the next
  // forward and backward), not after the next update, so the flush gets the whole interval.
  writer_.start(snapshot_.step, [this, &landed] {
    landed.synchronize();
    copy_out_of_pinned();
    return write(snapshot_);
  });
}

void Checkpointer::after_step(const UpdateStepStats& stats) {
  if (!capturing_step_) return;
  Stopwatch watch;
  engine_.finish_capture();
  capturing_step_.reset();
  if (several_ranks() && !streamed_) {
    // Rank 0 writes the weights whole: the partitions of the others first.
    if (layout_.gather_params) layout_.gather_params(capture_target(0));
    writer_.start(snapshot_.step, [this] {
      copy_out_of_pinned();
      report_ = write_rank_checkpoint_files(*staging_, comm_.rank(), comm_.world_size(), snapshot_,
                                            layout_.shard_of(arrays_source(snapshot_)));
      return fs::path();
    });
  }
  pending_stall_ms_ += stats.capture_wait_ms + watch.millis();
}

void Checkpointer::save_now(TrainingState state, const std::function<fs::path()>& save) {
  Stopwatch watch;
  finish_in_flight();
  BackgroundCheckpointWriter::Outcome outcome{.step = state.step};
  Stopwatch flush;
  try {
    if (streamed_) {
      // This thread drains the pool while the engine's fills it.
      outcome.path = save_streamed_now(std::move(state));
    } else {
      outcome.path = save();
    }
    if (comm_.rank() == 0)
      prune_checkpoints(root_, config_.train.keep_checkpoints, checkpoint_lineage);
  } catch (const Error& e) {
    if (several_ranks()) throw;  // collective saves fail on every rank together
    outcome.error = e.what();
  }
  outcome.flush_ms = flush.millis();
  pending_stall_ms_ = watch.millis();
  CheckpointRecord record = finished(outcome);
  record.lazy = false;
  done_.push_back(std::move(record));
}

std::vector<CheckpointRecord> Checkpointer::collect(bool wait) {
  TANDEM_CHECK(!wait || !capturing_step_, "checkpoint ", capturing_step_.value_or(0),
               ": collect(wait) before the step that completes its snapshot");
  if (capturing_step_) {
    // Its stall is not complete until after_step: collected later.
  } else if (several_ranks()) {
    if (staging_) try_commit(wait);
  } else if (wait) {
    finish_in_flight();
  } else if (std::optional<BackgroundCheckpointWriter::Outcome> outcome = writer_.poll()) {
    done_.push_back(finished(*outcome));
  }
  std::vector<CheckpointRecord> out = std::exchange(done_, {});
  for (const CheckpointRecord& record : out)
    if (!record.error.empty() && config_.train.checkpoint_failure == CheckpointFailure::kStop)
      fail(record.error, " (train.checkpoint_failure = \"continue\" would note this and train on)");
  return out;
}

void Checkpointer::finish_in_flight() {
  if (several_ranks()) {
    if (staging_) try_commit(true);
    return;
  }
  if (std::optional<BackgroundCheckpointWriter::Outcome> outcome = writer_.wait())
    done_.push_back(finished(*outcome));
}

void Checkpointer::try_commit(bool wait) {
  Stopwatch blocked;
  const bool mine_done = wait || writer_.finished();
  if (!all_ranks_ok(comm_, mine_done)) return;  // a rank is still writing: next step
  std::optional<BackgroundCheckpointWriter::Outcome> outcome = writer_.wait();
  TANDEM_CHECK(outcome.has_value(), "checkpoint ", staging_->step, ": no write in flight");
  Stopwatch commit;
  try {
    outcome->path = commit_sharded_checkpoint(comm_, *staging_, report_, engine_.plan().num_params,
                                              layout_.shard_of());
    if (comm_.rank() == 0) {
      prune_checkpoints(root_, config_.train.keep_checkpoints, checkpoint_lineage);
    } else {
      outcome->path.clear();  // as synchronous saves: rank 0 names the checkpoint
    }
  } catch (const Error& e) {
    outcome->error = e.what();  // every rank throws from the commit alike
  }
  outcome->flush_ms += commit.millis();
  staging_.reset();  // unpublished: its directory goes
  pending_stall_ms_ += blocked.millis();
  done_.push_back(finished(*outcome));
}

RankCheckpointLayout RankCheckpointLayout::of(const TrainConfig& config, int rank, ParamRange held,
                                              std::function<void(float* params)> gather_params) {
  const OptimizerFamily& family = optimizer_family(config.optimizer.type);
  RankCheckpointLayout layout;
  layout.zero_stage = config.zero.stage;
  layout.per_rank = family.state_per_rank;
  layout.range = layout.per_rank || config.zero.stage > 0 || rank == 0 ? held : ParamRange{};
  layout.names = family.state_names();
  if (config.zero.stage > 0) layout.gather_params = std::move(gather_params);
  return layout;
}

ShardedOptimizerState RankCheckpointLayout::shard_of(StateSource source) const {
  return {.zero_stage = zero_stage,
          .per_rank = per_rank,
          .range = range,
          .names = names,
          .source = std::move(source)};
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
    // The disk's figures only where the disk may be why.
    const bool not_finite = outcome.error.find(kNotFiniteMessage) != std::string::npos;
    record.error = cat("the checkpoint of step ", outcome.step, " failed: ", outcome.error,
                       not_finite ? std::string()
                                  : cat("; it needs about ", format_bytes(checkpoint_bytes()),
                                        ec ? std::string()
                                           : cat(" and ", root_.string(), " has ",
                                                 format_bytes(space.available), " free")),
                       intact_checkpoint_text());
  }
  return record;
}

std::string Checkpointer::intact_checkpoint_text() const {
  try {
    const fs::path latest = resolve_checkpoint(root_);
    return cat("; the previous checkpoint, ", latest.filename().string(),
               ", is intact and 'latest' still names it");
  } catch (const Error&) {
    return "; no earlier checkpoint of this run is on disk";
  }
}

uint64_t Checkpointer::checkpoint_bytes() const {
  return static_cast<uint64_t>(engine_.plan().num_params) * engine_.rule().state_floats() *
         sizeof(float);
}

void Checkpointer::drain_pool(
    const std::function<void(ParamRange, std::span<const float* const>)>& write) {
  std::vector<const float*> arrays(engine_.rule().state_floats());
  while (std::optional<SnapshotPool::Piece> piece = pool_->next()) {
    pool_->copied(piece->slot).synchronize();
    const float* data = pool_->data(piece->slot);
    for (size_t k = 0; k < arrays.size(); k++) arrays[k] = data + k * piece->range.size();
    write(piece->range, arrays);
    pool_->release(piece->slot);
  }
}

void Checkpointer::begin_streamed_capture() {
  if (!pool_) return;
  pool_->open();
  engine_.begin_streamed_capture(*pool_);
}

fs::path Checkpointer::save_streamed_now(TrainingState state) {
  if (!several_ranks()) {
    snapshot_ = std::move(state);
    begin_streamed_capture();
    fs::path path;
    try {
      path = write_streamed(snapshot_);
    } catch (const Error&) {
      engine_.finish_capture();  // abandoned: it ends without the writer
      throw;
    }
    engine_.finish_capture();
    return path;
  }
  ShardedStaging staging = open_streamed_sharded_checkpoint(comm_, root_, state);
  snapshot_ = std::move(state);
  begin_streamed_capture();
  const ShardReport mine = write_rank_streamed(staging);
  engine_.finish_capture();
  const fs::path path = commit_sharded_checkpoint(comm_, staging, mine, engine_.plan().num_params,
                                                  layout_.shard_of());
  return comm_.rank() == 0 ? path : fs::path();
}

ShardReport Checkpointer::write_rank_streamed(const ShardedStaging& staging) {
  try {
    RankStreamedFiles files(staging, comm_.rank(), comm_.world_size(), config_, layout_.shard_of());
    if (pool_)
      drain_pool([&](ParamRange range, std::span<const float* const> arrays) {
        files.write(range, arrays);
      });
    return files.finish();
  } catch (const std::exception& e) {
    if (pool_) pool_->abandon();  // the capture ends without this writer
    return failed_shard_report(e.what());
  }
}

fs::path Checkpointer::write_streamed(const TrainingState& state) {
  try {
    StreamedTrainingCheckpoint checkpoint(root_, state);
    drain_pool([&](ParamRange range, std::span<const float* const> arrays) {
      checkpoint.write(range, arrays);
    });
    const fs::path path = checkpoint.publish();
    prune_checkpoints(root_, config_.train.keep_checkpoints, checkpoint_lineage);
    return path;
  } catch (...) {
    pool_->abandon();  // the capture ends without this writer
    throw;
  }
}

fs::path Checkpointer::write(const TrainingState& state) const {
  const fs::path path = save_training_checkpoint(root_, state);
  prune_checkpoints(root_, config_.train.keep_checkpoints, checkpoint_lineage);
  return path;
}

}  // namespace tandem
