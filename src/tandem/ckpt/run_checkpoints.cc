#include "tandem/ckpt/run_checkpoints.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/resume_check.h"
#include "tandem/ckpt/sharded_checkpoint.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/timer.h"
#include "tandem/offload/update_engine.h"
#include "tandem/zero/data_parallel.h"

namespace tandem {

namespace fs = std::filesystem;

RunCheckpoints::RunCheckpoints(Parts parts)
    : parts_(std::move(parts)),
      checkpointer_(parts_.config, parts_.engine, parts_.device, parts_.comm, parts_.root,
                    rank_layout(), parts_.snapshot, parts_.saves) {}

void RunCheckpoints::start() { lineage_.agree_on_token(parts_.comm); }

fs::path RunCheckpoints::resume(const fs::path& requested, bool allow_inexact,
                                const std::function<void(const fs::path&)>& refuse,
                                LoopPosition& position) {
  const ResumableCheckpoint chosen = newest_verified_checkpoint(requested, checkpoint_lineage);
  const fs::path& path = chosen.dir;
  // New checkpoints go to this run's directory: never among another run's.
  refuse(path);
  if (!chosen.passed_over.empty())
    parts_.note(cat("tandem: passed over checkpoints that do not verify (", chosen.passed_over,
                    "); resuming from ", path.string()));
  const TrainingState state = read_training_state(path);
  Communicator& comm = parts_.comm;
  for (const std::string& note : check_resumable(path, state, parts_.config,
                                                 {.train_tokens_xxh3 = parts_.train_tokens_xxh3,
                                                 .train_tokens = parts_.train_tokens,
                                                 .world_size = comm.world_size()},
                                                 allow_inexact))
    parts_.note(note);
  lineage_.continue_from(state.lineage);
  // Every rank streams the weights whole and its optimizer state (its partition, from the
  // shards that overlap it; or its own) from the files into the engine, a few MiB at a
  // time, read in place where the host holds the state: any world size and stage resumes
  // any other's partitioned checkpoint, and no copy of the state is made on the way.
  Stopwatch reading;
  uint64_t bytes_read = 0;
  DataParallel& data_parallel = parts_.data_parallel;
  std::string error;
  try {
    parts_.engine.load_state(
        [&](const UpdateEngine::StateSink& put, const UpdateEngine::StatePlace& place) {
          bytes_read = stream_training_arrays(path, state,
                                              {.keep = data_parallel.state_range(),
                                               .rank = comm.rank(),
                                               .world_size = comm.world_size()},
                                              put, place);
        },
        state.step);
  } catch (const Error& e) {
    error = e.what();
  }
  // Every rank has read its part (a shard missing from the manifest is one rank's error)
  // before any says it resumed.
  fail_together(comm, error,
                "another rank could not read its part of the checkpoint (its "
                "error says why)");
  data_parallel.parameters_loaded();
  position = {
      .step = state.step, .train_position = state.train_position, .sample_rng = state.sample_rng};
  const double seconds = reading.millis() / 1e3;
  parts_.note(cat("tandem: resumed ", path.string(), " at step ", state.step, " of ",
                  parts_.config.train.steps, " (", format_bytes(bytes_read), " read in ",
                  format_fixed(seconds, 2), " s, ",
                  format_fixed(seconds > 0 ? bytes_read / seconds / 1e9 : 0.0, 2), " GB/s)"));
  return path;
}

// A lazy checkpoint begun after the last step has its snapshot now.
void RunCheckpoints::step_attempted(int64_t) {
  checkpointer_.after_step(parts_.engine.last_step_stats());
}

void RunCheckpoints::step_finished(int64_t step, bool last) {
  const int64_t every = parts_.config.train.checkpoint_interval;
  if (parts_.saves && (last || (every > 0 && step % every == 0))) {
    parts_.before_save();
    // The last checkpoint has no next step to hide behind: it is written now.
    if (parts_.config.train.lazy_checkpoints && !last)
      checkpointer_.begin_lazy(state_now());
    else
      checkpointer_.save_now(state_now(), [this] { return save(); });
    lineage_.begun_at(step);
  }
  record(checkpointer_.collect(last));
}

// The checkpoint in flight is finished first: the error then names what is intact.
void RunCheckpoints::stopping_on_error() { record(checkpointer_.collect(true)); }

void RunCheckpoints::record(std::vector<CheckpointRecord> records) {
  for (CheckpointRecord& r : records) parts_.recorded(std::move(r));
}

// What a checkpoint holds besides the engine's arrays.
TrainingState RunCheckpoints::state_now() const {
  const LoopPosition position = parts_.position();
  TrainingState state;
  state.config = parts_.config;
  state.step = position.step;
  state.train_position = position.train_position;
  state.sample_rng = position.sample_rng;
  state.train_tokens_xxh3 = parts_.train_tokens_xxh3;
  state.train_tokens = parts_.train_tokens;
  state.world_size = parts_.comm.world_size();
  state.lineage = lineage_.at(position.step);
  return state;
}

RankCheckpointLayout RunCheckpoints::rank_layout() {
  DataParallel& data_parallel = parts_.data_parallel;
  return RankCheckpointLayout::of(
      parts_.config, parts_.comm.rank(), data_parallel.state_range(),
      [&data_parallel](float* params) { data_parallel.gather_partitions(params, sizeof(float)); });
}

// A collective: every rank hands its partition of the state to the others; rank 0 writes
// the checkpoint (the others return an empty path).
fs::path RunCheckpoints::save() {
  TrainingState state = state_now();
  UpdateEngine& engine = parts_.engine;
  if (parts_.comm.world_size() == 1) {
    // Written from the engine's own memory, tensor by tensor: no copy of the state.
    return save_training_checkpoint(parts_.root, state,
                                    [&engine](size_t array, ParamRange range, float* scratch) {
                                      return engine.state_span(array, range, scratch);
                                    });
  }
  // Rank 0 writes the weights: every rank's partition of the fp32 params, gathered (the
  // only copy of the state made). Each rank writes its part of the optimizer state from
  // the engine's own memory (rank_layout).
  state.params.resize(static_cast<size_t>(parts_.config.model.num_parameters()));
  const ParamRange held = engine.plan().partition;
  for (size_t b = held.begin; b < held.end; b += UpdateEngine::kPieceFloats) {
    const ParamRange piece{b, std::min(b + UpdateEngine::kPieceFloats, held.end)};
    float* to = state.params.data() + b;  // also the scratch state_span may fill
    const float* values = engine.state_span(0, piece, to);
    if (values != to) std::copy(values, values + piece.size(), to);
  }
  parts_.data_parallel.gather_partitions(state.params.data(), sizeof(float));
  const ShardedOptimizerState shard =
      rank_layout().shard_of([&engine](size_t array, ParamRange range, float* scratch) {
        return engine.state_span(array, range, scratch);
      });
  const fs::path path = save_sharded_training_checkpoint(parts_.comm, parts_.root, state, shard);
  return parts_.comm.rank() == 0 ? path : fs::path();
}

}  // namespace tandem
