#include "tandem/ckpt/streamed_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "tandem/ckpt/hf_weights.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/model/model_family.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace fs = std::filesystem;

// A tensor file being filled in place; closed on destruction.
struct StreamedFiles::OpenFile {
  fs::path path;
  int fd = -1;

  OpenFile(fs::path where, int flags) : path(std::move(where)) {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd < 0) fail(path.string(), ": cannot open for writing (", std::strerror(errno), ")");
  }
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  void write_at(const void* data, size_t bytes, uint64_t offset) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail(path.string(), ": writing ", bytes, " bytes at offset ", offset, " failed (",
             n < 0 ? std::strerror(errno) : "no progress", ")");
      p += n;
      bytes -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
  }
  void sync_and_close() {
    if (::fsync(fd) != 0) fail(path.string(), ": fsync failed (", std::strerror(errno), ")");
    const int rc = ::close(std::exchange(fd, -1));
    if (rc != 0) fail(path.string(), ": close failed (", std::strerror(errno), ")");
  }
};

StreamedFiles::StreamedFiles() = default;
StreamedFiles::~StreamedFiles() = default;

size_t StreamedFiles::create(const fs::path& path, const SafetensorsWriter::Placement& placement) {
  auto file = std::make_unique<OpenFile>(path, O_WRONLY | O_CREAT | O_TRUNC);
  // Reserving every block now makes a full disk fail here, before the first piece,
  // rather than part of the way through the snapshot.
  const int rc = ::posix_fallocate(file->fd, 0, static_cast<off_t>(placement.file_bytes));
  if (rc != 0)
    fail(path.string(), ": cannot reserve ", format_bytes(placement.file_bytes), " (",
         std::strerror(rc), ")");
  file->write_at(placement.prefix.data(), placement.prefix.size(), 0);
  files_.push_back(std::move(file));
  return files_.size() - 1;
}

size_t StreamedFiles::open(const fs::path& path) {
  files_.push_back(std::make_unique<OpenFile>(path, O_WRONLY));
  return files_.size() - 1;
}

void StreamedFiles::place(size_t array, ParamRange segment, size_t file, uint64_t offset,
                          std::string tensor, size_t transposed_cols) {
  TANDEM_CHECK(file < files_.size(), "streamed checkpoint: no file ", file);
  TANDEM_CHECK(transposed_cols == 0 || segment.size() % transposed_cols == 0,
               "streamed checkpoint: a transposed segment of ", segment.size(),
               " elements is not a matrix of ", transposed_cols, " columns");
  if (segments_.size() <= array) segments_.resize(array + 1);
  segments_[array].push_back({segment, file, offset, transposed_cols, std::move(tensor)});
}

uint64_t StreamedFiles::write(ParamRange range, std::span<const float* const> arrays) {
  TANDEM_CHECK(range.begin <= range.end, "streamed checkpoint: range [", range.begin, ", ",
               range.end, ") is reversed");
  uint64_t written = 0;
  for (size_t k = 0; k < arrays.size() && k < segments_.size(); k++) {
    if (arrays[k] == nullptr) continue;
    for (const Segment& segment : segments_[k]) {
      const size_t b = std::max(range.begin, segment.flat.begin);
      const size_t e = std::min(range.end, segment.flat.end);
      if (b >= e) continue;
      const float* data = arrays[k] + (b - range.begin);
      check_finite_tensor(segment.tensor, data, e - b, step_);
      write_segment_part(segment, b - segment.flat.begin, e - b, data);
      written += e - b;
    }
  }
  return written;
}

void StreamedFiles::write_segment_part(const Segment& segment, size_t first, size_t count,
                                       const float* data) {
  OpenFile& file = *files_[segment.file];
  if (segment.transposed_cols == 0) {
    file.write_at(data, count * sizeof(float), segment.offset + first * sizeof(float));
    return;
  }
  // Element (r, c) of the [R, C] matrix is element (c, r) of the stored [C, R]: the
  // piece's elements of column c are a contiguous run of rows in the file.
  const size_t C = segment.transposed_cols, R = segment.flat.size() / C;
  const size_t end = first + count;
  auto first_row_at_or_after = [C](size_t index, size_t c) {
    return index > c ? (index - c + C - 1) / C : 0;
  };
  column_.resize(std::min(R, count));
  for (size_t c = 0; c < C; c++) {
    const size_t r_begin = first_row_at_or_after(first, c);
    const size_t r_end = std::min(R, first_row_at_or_after(end, c));
    if (r_begin >= r_end) continue;
    for (size_t r = r_begin; r < r_end; r++) column_[r - r_begin] = data[r * C + c - first];
    file.write_at(column_.data(), (r_end - r_begin) * sizeof(float),
                  segment.offset + (c * R + r_begin) * sizeof(float));
  }
}

void StreamedFiles::sync_and_close() {
  for (const std::unique_ptr<OpenFile>& file : files_)
    if (file->fd >= 0) file->sync_and_close();
}

const fs::path& StreamedFiles::path(size_t file) const { return files_.at(file)->path; }

std::vector<std::string> place_streamed_weights(StreamedFiles& files, const fs::path& dir,
                                                const TrainConfig& config, bool create) {
  const ParamLayout layout = model_layout(config.model);
  std::vector<std::string> names;
  for (const WeightShard& shard : plan_weight_shards(layout, config.train.max_shard_size)) {
    const SafetensorsWriter::Placement placement = place_weight_shard(layout, shard);
    const size_t file =
        create ? files.create(dir / shard.file, placement) : files.open(dir / shard.file);
    for (size_t i = 0; i < shard.views.size(); i++) {
      const ParamView& view = layout.views()[shard.views[i]];
      files.place(0, {view.offset, view.offset + view.numel}, file, placement.offsets[i], view.name,
                  view.hf_transposed ? static_cast<size_t>(view.shape[1]) : 0);
    }
    names.push_back(shard.file);
  }
  return names;
}

StreamedTrainingCheckpoint::StreamedTrainingCheckpoint(const fs::path& checkpoints_root,
                                                       const TrainingState& state)
    : state_(state.without_arrays()),
      num_arrays_(1 + optimizer_family(state_.config.optimizer.type).state_names().size()),
      staged_(checkpoints_root, state_.step) {
  files_.set_step(state_.step);
  weight_files_ = place_streamed_weights(files_, staged_.dir(), state_.config, true);
  // The optimizer's arrays, view by view, array by array (optimizer_file_writer's order).
  const ParamLayout layout = model_layout(state_.config.model);
  const SafetensorsWriter::Placement placement =
      optimizer_file_writer(state_, layout).placement("optimizer.safetensors");
  const size_t file = files_.create(staged_.dir() / "optimizer.safetensors", placement);
  const std::vector<std::string> names =
      optimizer_family(state_.config.optimizer.type).state_names();
  size_t tensor = 0;
  for (const ParamView& view : layout.views())
    for (size_t k = 1; k < num_arrays_; k++)
      files_.place(k, {view.offset, view.offset + view.numel}, file, placement.offsets[tensor++],
                   names[k - 1] + "." + view.name);
}

StreamedTrainingCheckpoint::~StreamedTrainingCheckpoint() = default;

void StreamedTrainingCheckpoint::write(ParamRange range, std::span<const float* const> arrays) {
  const size_t P = static_cast<size_t>(state_.config.model.num_parameters());
  TANDEM_CHECK(arrays.size() == num_arrays_, "streamed checkpoint: ", arrays.size(),
               " state arrays for an optimizer that keeps ", num_arrays_);
  TANDEM_CHECK(range.begin <= range.end && range.end <= P, "streamed checkpoint: range [",
               range.begin, ", ", range.end, ") outside the ", P, " parameters");
  floats_written_ += files_.write(range, arrays);
}

fs::path StreamedTrainingCheckpoint::publish() {
  const uint64_t expected =
      static_cast<uint64_t>(state_.config.model.num_parameters()) * num_arrays_;
  TANDEM_CHECK(floats_written_ == expected, staged_.dir().string(),
               ": the streamed snapshot wrote ", floats_written_, " of the checkpoint's ", expected,
               " floats");
  files_.sync_and_close();
  // The manifest lists the files in the order a synchronous save writes them.
  for (const std::string& name : weight_files_)
    staged_.add_written(record_checkpoint_file(staged_.dir() / name));
  if (weight_files_.size() > 1) {
    const ParamLayout layout = model_layout(state_.config.model);
    const std::vector<WeightShard> shards =
        plan_weight_shards(layout, state_.config.train.max_shard_size);
    staged_.write({kWeightIndexFile,
                   [&](File& out) { out.write_all(weight_index(layout, shards).dump(2) + "\n"); }});
  }
  for (const CheckpointFileWriter& file : training_checkpoint_json_files(state_))
    staged_.write(file);
  staged_.add_written(record_checkpoint_file(staged_.dir() / "optimizer.safetensors"));
  return staged_.publish();
}

}  // namespace tandem
