// A training checkpoint whose tensors arrive in pieces, in any order: what a lazy
// snapshot streamed through a bounded buffer pool hands the writer (train/checkpointer.h)
// when a full second copy of the state does not fit in host memory.
//
// The files are those save_training_checkpoint writes, byte for byte (the tests compare
// them): model.safetensors (or its shards and index) in Hugging Face's layout,
// optimizer.safetensors, config.json, trainer_state.json, manifest.json. Each tensor file
// is created at its full size up front (so a full disk fails before the first piece, not
// halfway) with its header in place, and every piece goes straight to its offsets with
// pwrite; a Conv1D weight's rows land as columns of its transposed Hugging Face tensor.
// Publishing syncs and checksums every file and renames the staging directory into
// place, as a synchronous save does; destroyed unpublished, nothing of it remains.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/model/param_layout.h"
#include "tandem/model/param_range.h"
#include "tandem/train/train_checkpoint.h"

namespace tandem {

class StreamedTrainingCheckpoint {
 public:
  // `state`: the checkpoint's config, step, data position and RNG (its arrays are not
  // read). Creates the staging directory and the tensor files; throws naming the file and
  // the bytes it needs when the disk cannot hold them.
  StreamedTrainingCheckpoint(const std::filesystem::path& checkpoints_root, TrainingState state);
  ~StreamedTrainingCheckpoint();
  StreamedTrainingCheckpoint(const StreamedTrainingCheckpoint&) = delete;
  StreamedTrainingCheckpoint& operator=(const StreamedTrainingCheckpoint&) = delete;

  // The state arrays of the flat parameters [range.begin, range.end): arrays[0] the fp32
  // params, arrays[1 + k] optimizer array k (optimizer_state_names order), range.size()
  // floats each. Pieces must not overlap; together they cover every parameter once.
  void write(ParamRange range, std::span<const float* const> arrays);
  // Every parameter written: syncs and checksums the files, adds the small ones and the
  // manifest, and publishes the checkpoint (`latest` last). Returns its directory.
  std::filesystem::path publish();

  // The bytes of the tensor files (what the constructor reserves).
  uint64_t tensor_bytes() const { return tensor_bytes_; }

 private:
  struct OpenFile;
  // Where the elements of one view of one state array go.
  struct Placed {
    size_t file = 0;      // into files_
    uint64_t offset = 0;  // of the tensor's first byte
  };

  void write_view_part(const ParamView& view, const Placed& where, bool transposed, size_t first,
                       size_t count, const float* data);

  TrainingState state_;
  ParamLayout layout_;
  StagedCheckpoint staged_;
  std::vector<std::unique_ptr<OpenFile>> files_;
  std::vector<std::string> weight_files_;  // the weight shards' names, for the index
  // placed_[k][v]: array k (0: params) of view v.
  std::vector<std::vector<Placed>> placed_;
  std::vector<float> column_;  // scratch for a transposed piece's column
  uint64_t tensor_bytes_ = 0;
  uint64_t floats_written_ = 0;
};

}  // namespace tandem
