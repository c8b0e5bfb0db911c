#include "tandem/train/streamed_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "tandem/ckpt/gpt2_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/format.h"
#include "tandem/train/optimizer_setup.h"

namespace tandem {
namespace fs = std::filesystem;

// A tensor file being filled in place: created at its full size, closed on destruction.
struct StreamedTrainingCheckpoint::OpenFile {
  fs::path path;
  int fd = -1;

  OpenFile(fs::path where, const SafetensorsWriter::Placement& placement) : path(std::move(where)) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(path.string(), ": cannot create (", std::strerror(errno), ")");
    // Reserving every block now makes a full disk fail here, before the first piece,
    // rather than part of the way through the snapshot.
    const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(placement.file_bytes));
    if (rc != 0)
      fail(path.string(), ": cannot reserve ", format_bytes(placement.file_bytes), " (",
           std::strerror(rc), ")");
    write_at(placement.prefix.data(), placement.prefix.size(), 0);
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
  void close() {
    const int rc = ::close(std::exchange(fd, -1));
    if (rc != 0) fail(path.string(), ": close failed (", std::strerror(errno), ")");
  }
};

StreamedTrainingCheckpoint::StreamedTrainingCheckpoint(const fs::path& checkpoints_root,
                                                       TrainingState state)
    : state_(std::move(state)),  // its arrays are not needed: dropped below
      layout_(ParamLayout::gpt2(state_.config.model)),
      staged_(checkpoints_root, state_.step) {
  state_.params = {};
  state_.optimizer_state = {};
  const std::vector<ParamView>& views = layout_.views();
  const size_t num_arrays = 1 + optimizer_state_names(state_.config.optimizer).size();
  placed_.assign(num_arrays, std::vector<Placed>(views.size()));
  auto open = [&](const std::string& name, const SafetensorsWriter::Placement& placement) {
    files_.push_back(std::make_unique<OpenFile>(staged_.dir() / name, placement));
    tensor_bytes_ += placement.file_bytes;
    return files_.size() - 1;
  };
  // The weights, shard by shard, in Hugging Face's layout.
  for (const WeightShard& shard :
       plan_gpt2_weight_shards(layout_, state_.config.train.max_shard_size)) {
    const SafetensorsWriter::Placement placement = place_gpt2_weight_shard(layout_, shard);
    const size_t file = open(shard.file, placement);
    for (size_t i = 0; i < shard.views.size(); i++)
      placed_[0][shard.views[i]] = {file, placement.offsets[i]};
    weight_files_.push_back(shard.file);
  }
  // The optimizer's arrays, view by view, array by array (optimizer_file_writer's order).
  const SafetensorsWriter::Placement placement =
      optimizer_file_writer(state_, layout_).placement("optimizer.safetensors");
  const size_t file = open("optimizer.safetensors", placement);
  size_t tensor = 0;
  for (size_t v = 0; v < views.size(); v++)
    for (size_t k = 1; k < num_arrays; k++) placed_[k][v] = {file, placement.offsets[tensor++]};
}

StreamedTrainingCheckpoint::~StreamedTrainingCheckpoint() = default;

void StreamedTrainingCheckpoint::write(ParamRange range, std::span<const float* const> arrays) {
  const size_t P = layout_.num_elements();
  TANDEM_CHECK(arrays.size() == placed_.size(), "streamed checkpoint: ", arrays.size(),
               " state arrays for an optimizer that keeps ", placed_.size());
  TANDEM_CHECK(range.begin <= range.end && range.end <= P, "streamed checkpoint: range [",
               range.begin, ", ", range.end, ") outside the ", P, " parameters");
  for (size_t v = 0; v < layout_.views().size(); v++) {
    const ParamView& view = layout_.views()[v];
    const size_t b = std::max(range.begin, view.offset);
    const size_t e = std::min(range.end, view.offset + view.numel);
    if (b >= e) continue;
    for (size_t k = 0; k < arrays.size(); k++)
      write_view_part(view, placed_[k][v], k == 0 && view.hf_transposed, b - view.offset, e - b,
                      arrays[k] + (b - range.begin));
  }
  floats_written_ += static_cast<uint64_t>(range.size()) * arrays.size();
}

void StreamedTrainingCheckpoint::write_view_part(const ParamView& view, const Placed& where,
                                                 bool transposed, size_t first, size_t count,
                                                 const float* data) {
  OpenFile& file = *files_[where.file];
  if (!transposed) {
    file.write_at(data, count * sizeof(float), where.offset + first * sizeof(float));
    return;
  }
  // Tandem's [R, C] element (r, c) is element (c, r) of Hugging Face's [C, R]: the piece's
  // elements of column c are a contiguous run of rows in the file.
  const size_t R = static_cast<size_t>(view.shape[0]), C = static_cast<size_t>(view.shape[1]);
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
                  where.offset + (c * R + r_begin) * sizeof(float));
  }
}

fs::path StreamedTrainingCheckpoint::publish() {
  const uint64_t expected = static_cast<uint64_t>(layout_.num_elements()) * placed_.size();
  TANDEM_CHECK(floats_written_ == expected, staged_.dir().string(),
               ": the streamed snapshot wrote ", floats_written_, " of the checkpoint's ", expected,
               " floats");
  for (const std::unique_ptr<OpenFile>& file : files_) file->close();
  // The manifest lists the files in the order a synchronous save writes them.
  for (size_t i = 0; i < weight_files_.size(); i++)
    staged_.add_written(record_checkpoint_file(files_[i]->path));
  if (weight_files_.size() > 1) {
    const std::vector<WeightShard> shards =
        plan_gpt2_weight_shards(layout_, state_.config.train.max_shard_size);
    staged_.write({kWeightIndexFile, [&](const fs::path& p) {
                     write_file_atomic(p, gpt2_weight_index(layout_, shards).dump(2) + "\n");
                   }});
  }
  for (const CheckpointFileWriter& file : training_checkpoint_json_files(state_))
    staged_.write(file);
  staged_.add_written(record_checkpoint_file(files_.back()->path));
  return staged_.publish();
}

}  // namespace tandem
