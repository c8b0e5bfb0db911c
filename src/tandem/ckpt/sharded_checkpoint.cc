#include "tandem/ckpt/sharded_checkpoint.h"

#include <cstdio>
#include <memory>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/ckpt/streamed_checkpoint.h"
#include "tandem/comm/agreement.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer_shard_%05d_of_%05d.safetensors", rank, world);
  return name;
}

void copy_text(char* dst, size_t size, const std::string& text) {
  std::snprintf(dst, size, "%s", text.c_str());
}

}  // namespace

namespace {

// Phase 1 of either kind: rank 0 creates the staging directory and, for a streamed
// checkpoint of `streamed` (null: none), lays out the weight files in it.
ShardedStaging open_staging(Communicator& comm, const fs::path& checkpoints_root, int64_t step,
                            const TrainingState* streamed) {
  ShardedStaging staging{.step = step};
  std::string dir, error;
  if (comm.rank() == 0) {
    try {
      staging.staged = std::make_unique<StagedCheckpoint>(checkpoints_root, step);
      dir = staging.staged->dir().string();
      if (streamed != nullptr) {
        staging.streamed = std::make_unique<TrainingState>(streamed->without_arrays());
        StreamedFiles laid_out;
        staging.weight_files =
            place_streamed_weights(laid_out, staging.staged->dir(), streamed->config, true);
      }
    } catch (const Error& e) {
      error = e.what();
    }
  }
  staging.dir = broadcast_string(comm, dir, 0);
  fail_together(comm, error, "checkpoint: rank 0 could not open the staging directory");
  return staging;
}

}  // namespace

ShardedStaging open_sharded_checkpoint(Communicator& comm, const fs::path& checkpoints_root,
                                       int64_t step) {
  return open_staging(comm, checkpoints_root, step, nullptr);
}

ShardedStaging open_streamed_sharded_checkpoint(Communicator& comm,
                                                const fs::path& checkpoints_root,
                                                const TrainingState& state) {
  return open_staging(comm, checkpoints_root, state.step, &state);
}

struct RankStreamedFiles::Files {
  StreamedFiles files;
  fs::path shard_path;  // empty: this rank writes no optimizer state
  uint64_t expected = 0, written = 0;
  ParamRange range;
};

RankStreamedFiles::RankStreamedFiles(const ShardedStaging& staging, int rank, int world_size,
                                     const TrainConfig& config, const ShardedOptimizerState& shard)
    : files_(std::make_unique<Files>()) {
  Files& f = *files_;
  f.range = shard.range;
  f.files.set_step(staging.step);
  const size_t names = shard.names.size();
  if (writes_params(shard.zero_stage, rank)) {
    place_streamed_weights(f.files, staging.dir, config, false);
    f.expected += shard.range.size();
  }
  if (shard.range.size() > 0) {
    const auto n = static_cast<int64_t>(shard.range.size());
    SafetensorsWriter writer;
    for (const std::string& name : shard.names) writer.add(name, DType::kF32, {n}, nullptr);
    writer.set_metadata("begin", std::to_string(shard.range.begin));
    writer.set_metadata("end", std::to_string(shard.range.end));
    writer.set_metadata("step", std::to_string(staging.step));
    f.shard_path = staging.dir / shard_file_name(rank, world_size);
    const SafetensorsWriter::Placement placement = writer.placement(f.shard_path.string());
    const size_t file = f.files.create(f.shard_path, placement);
    for (size_t k = 0; k < names; k++)
      f.files.place(1 + k, shard.range, file, placement.offsets[k],
                    cat(shard.names[k], "[", shard.range.begin, ":", shard.range.end, ")"));
    f.expected += shard.range.size() * names;
  }
}

RankStreamedFiles::~RankStreamedFiles() = default;

void RankStreamedFiles::write(ParamRange range, std::span<const float* const> arrays) {
  files_->written += files_->files.write(range, arrays);
}

ShardReport RankStreamedFiles::finish() {
  Files& f = *files_;
  ShardReport mine;
  mine.begin = f.range.begin;
  mine.end = f.range.end;
  try {
    TANDEM_CHECK(f.written == f.expected, "the streamed snapshot wrote ", f.written, " of this ",
                 "rank's ", f.expected, " floats");
    f.files.sync_and_close();
    if (!f.shard_path.empty()) {
      const CheckpointFileRecord record = record_checkpoint_file(f.shard_path);
      mine.written = 1;
      mine.bytes = record.bytes;
      copy_text(mine.xxh3_64, sizeof mine.xxh3_64, record.xxh3_64);
    }
    mine.ok = 1;
  } catch (const std::exception& e) {
    copy_text(mine.error, sizeof mine.error, e.what());
  }
  return mine;
}

ShardReport failed_shard_report(const std::string& error) {
  ShardReport report;
  copy_text(report.error, sizeof report.error, error);
  return report;
}

ShardReport write_rank_checkpoint_files(ShardedStaging& staging, int rank, int world_size,
                                        const TrainingState& state,
                                        const ShardedOptimizerState& shard) {
  ShardReport mine;
  mine.begin = shard.range.begin;
  mine.end = shard.range.end;
  try {
    if (shard.range.size() > 0) {
      const auto n = static_cast<int64_t>(shard.range.size());
      SafetensorsWriter writer;
      for (const std::string& name : shard.names) writer.add(name, DType::kF32, {n}, nullptr);
      writer.set_metadata("begin", std::to_string(shard.range.begin));
      writer.set_metadata("end", std::to_string(shard.range.end));
      writer.set_metadata("step", std::to_string(staging.step));
      const fs::path path = staging.dir / shard_file_name(rank, world_size);
      const SafetensorsWriter::Placement placement = writer.placement(path.string());
      const CheckpointFileRecord record = write_checkpoint_file(path, [&](File& out) {
        // Each array in pieces from its source, checked finite as it goes out: no copy of
        // the partition is made.
        out.write_all(placement.prefix);
        constexpr size_t kPiece = size_t{1} << 20;
        std::vector<float> scratch(std::min(kPiece, shard.range.size()));
        for (size_t k = 0; k < shard.names.size(); k++)
          for (size_t b = shard.range.begin; b < shard.range.end; b += kPiece) {
            const ParamRange piece{b, std::min(b + kPiece, shard.range.end)};
            const float* values = shard.source(1 + k, piece, scratch.data());
            check_finite_tensor(cat(shard.names[k], "[", piece.begin, ":", piece.end, ")"), values,
                                piece.size(), staging.step);
            out.write_all(values, piece.size() * sizeof(float));
          }
      });
      mine.written = 1;
      mine.bytes = record.bytes;
      copy_text(mine.xxh3_64, sizeof mine.xxh3_64, record.xxh3_64);
    }
    // Rank 0: the weights (every rank's partition of the fp32 params, gathered), config
    // and trainer state.
    if (rank == 0)
      for (const CheckpointFileWriter& file : training_checkpoint_files(state, false))
        staging.staged->write(file);
    mine.ok = 1;
  } catch (const std::exception& e) {
    copy_text(mine.error, sizeof mine.error, e.what());
  }
  return mine;
}

fs::path commit_sharded_checkpoint(Communicator& comm, ShardedStaging& staging,
                                   const ShardReport& mine, size_t num_params,
                                   const ShardedOptimizerState& shard) {
  const int world = comm.world_size();
  std::vector<ShardReport> reports(world);
  comm.all_gather(&mine, reports.data(), sizeof mine);
  for (int r = 0; r < world; r++)
    TANDEM_CHECK(reports[r].ok == 1, "checkpoint at step ", staging.step, ": rank ", r,
                 " could not write its files (", reports[r].error,
                 "); nothing was published, the previous checkpoint is intact");
  fs::path published;
  std::string error;
  if (comm.rank() == 0) {
    try {
      if (staging.streamed) {
        // Every rank's part of the weights is durable now: their checksums, then the small
        // files, in the order of a synchronous save's manifest.
        for (const std::string& name : staging.weight_files)
          staging.staged->add_written(record_checkpoint_file(staging.dir / name));
        if (staging.weight_files.size() > 1) {
          const ParamLayout layout = model_layout(staging.streamed->config.model);
          const std::vector<WeightShard> plan =
              plan_weight_shards(layout, staging.streamed->config.train.max_shard_size);
          staging.staged->write({kWeightIndexFile, [&](File& out) {
                                   out.write_all(weight_index(layout, plan).dump(2) + "\n");
                                 }});
        }
        for (const CheckpointFileWriter& file : training_checkpoint_json_files(*staging.streamed))
          staging.staged->write(file);
      }
      nlohmann::json shards = nlohmann::json::array();
      for (int r = 0; r < world; r++) {
        if (reports[r].written == 0) continue;
        const std::string name = shard_file_name(r, world);
        staging.staged->add_written({name, reports[r].bytes, reports[r].xxh3_64});
        shards.push_back(
            {{"file", name}, {"rank", r}, {"begin", reports[r].begin}, {"end", reports[r].end}});
      }
      published = staging.staged->publish({{"optimizer_shards",
                                            {{"num_params", num_params},
                                             {"world_size", world},
                                             {"zero_stage", shard.zero_stage},
                                             {"per_rank", shard.per_rank},
                                             {"shards", shards}}}});
    } catch (const Error& e) {
      error = e.what();
    }
  }
  const std::string path = broadcast_string(comm, published.string(), 0);
  fail_together(comm, error, "checkpoint: rank 0 could not publish the checkpoint");
  return path;
}

fs::path save_sharded_training_checkpoint(Communicator& comm, const fs::path& checkpoints_root,
                                          const TrainingState& state,
                                          const ShardedOptimizerState& shard) {
  ShardedStaging staging = open_sharded_checkpoint(comm, checkpoints_root, state.step);
  const ShardReport mine =
      write_rank_checkpoint_files(staging, comm.rank(), comm.world_size(), state, shard);
  return commit_sharded_checkpoint(comm, staging, mine, state.params.size(), shard);
}

}  // namespace tandem
