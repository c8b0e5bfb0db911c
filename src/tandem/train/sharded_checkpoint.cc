#include "tandem/train/sharded_checkpoint.h"

#include <cstdio>
#include <memory>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/dist/agreement.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer_shard_%05d_of_%05d.safetensors", rank, world);
  return name;
}

// What a rank tells rank 0 about its shard; fixed size for all_gather.
struct ShardReport {
  uint64_t ok = 0;
  uint64_t written = 0;  // 0: an empty partition, no file
  uint64_t bytes = 0;
  uint64_t begin = 0, end = 0;
  char xxh3_64[17] = {};
  char error[256] = {};
};

void copy_text(char* dst, size_t size, const std::string& text) {
  std::snprintf(dst, size, "%s", text.c_str());
}

}  // namespace

fs::path save_sharded_training_checkpoint(Communicator& comm, const fs::path& checkpoints_root,
                                          const TrainingState& state,
                                          const ShardedOptimizerState& shard) {
  const int rank = comm.rank(), world = comm.world_size();
  // 1. Rank 0 opens the staging directory and tells the others where it is.
  std::unique_ptr<StagedCheckpoint> staged;
  std::string staging, error;
  if (rank == 0) {
    try {
      staged = std::make_unique<StagedCheckpoint>(checkpoints_root, state.step);
      staging = staged->dir().string();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  staging = broadcast_string(comm, staging, 0);
  TANDEM_CHECK(all_ranks_ok(comm, error.empty()),
               rank == 0 ? error : "checkpoint: rank 0 could not open the staging directory");

  // 2. Every rank writes its shard of the optimizer state.
  ShardReport mine;
  mine.begin = shard.range.begin;
  mine.end = shard.range.end;
  try {
    if (shard.range.size() > 0) {
      const auto n = static_cast<int64_t>(shard.range.size());
      SafetensorsWriter writer;
      for (const auto& [name, array] : shard.arrays)
        writer.add(name, DType::kF32, {n}, array + shard.range.begin);
      writer.set_metadata("begin", std::to_string(shard.range.begin));
      writer.set_metadata("end", std::to_string(shard.range.end));
      writer.set_metadata("step", std::to_string(state.step));
      const fs::path path = fs::path(staging) / shard_file_name(rank, world);
      writer.write(path);
      const CheckpointFileRecord record = record_checkpoint_file(path);
      mine.written = 1;
      mine.bytes = record.bytes;
      copy_text(mine.xxh3_64, sizeof mine.xxh3_64, record.xxh3_64);
    }
    mine.ok = 1;
  } catch (const Error& e) {
    copy_text(mine.error, sizeof mine.error, e.what());
  }
  std::vector<ShardReport> reports(world);
  comm.all_gather(&mine, reports.data(), sizeof mine);
  for (int r = 0; r < world; r++)
    TANDEM_CHECK(reports[r].ok == 1, "checkpoint at step ", state.step, ": rank ", r,
                 " could not write its optimizer shard (", reports[r].error,
                 "); nothing was published, the previous checkpoint is intact");

  // 3. Rank 0 writes the rest, the manifest last, and publishes.
  fs::path published;
  if (rank == 0) {
    try {
      nlohmann::json shards = nlohmann::json::array();
      for (int r = 0; r < world; r++) {
        if (reports[r].written == 0) continue;
        const std::string name = shard_file_name(r, world);
        staged->add_written({name, reports[r].bytes, reports[r].xxh3_64});
        shards.push_back(
            {{"file", name}, {"rank", r}, {"begin", reports[r].begin}, {"end", reports[r].end}});
      }
      for (const CheckpointFileWriter& file : training_checkpoint_files(state, false))
        staged->write(file);
      published = staged->publish({{"optimizer_shards",
                                    {{"num_params", state.params.size()},
                                     {"world_size", world},
                                     {"zero_stage", shard.zero_stage},
                                     {"per_rank", shard.per_rank},
                                     {"shards", shards}}}});
    } catch (const Error& e) {
      error = e.what();
    }
  }
  const std::string path = broadcast_string(comm, published.string(), 0);
  TANDEM_CHECK(all_ranks_ok(comm, error.empty()),
               rank == 0 ? error : "checkpoint: rank 0 could not publish the checkpoint");
  return path;
}

}  // namespace tandem
