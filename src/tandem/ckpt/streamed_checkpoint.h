// Checkpoints whose state arrives in pieces, in any order: what a lazy snapshot streamed
// through a bounded buffer pool hands the writer (ckpt/checkpointer.h) when a full second
// copy of the state does not fit in host memory.
//
// The files are those a synchronous save writes, byte for byte (the tests compare them).
// Each tensor file is laid out in advance (created at its full size, so a full disk fails
// before the first piece, with its header in place) and every piece goes straight to its
// offsets with pwrite; a Conv1D weight's rows land as columns of its transposed Hugging
// Face tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/model/param_layout.h"
#include "tandem/model/param_range.h"

namespace tandem {

// Pieces of flat state arrays (array 0 the fp32 params, 1 + k optimizer array k) written
// to where files laid out in advance keep them.
class StreamedFiles {
 public:
  StreamedFiles();
  ~StreamedFiles();
  StreamedFiles(const StreamedFiles&) = delete;
  StreamedFiles& operator=(const StreamedFiles&) = delete;

  // Creates a file at its full size with its header (throws naming it and the bytes when
  // the disk cannot hold it), or opens one another writer created, to fill a part of it.
  // Returns the file's index.
  size_t create(const std::filesystem::path& path, const SafetensorsWriter::Placement& placement);
  size_t open(const std::filesystem::path& path);
  // Array `array`'s flat elements [segment.begin, segment.end) are stored from byte
  // `offset` of file `file`, in order; or, with `transposed_cols` > 0, as the transpose of
  // the [segment.size() / cols, cols] matrix they form (a Conv1D weight in Hugging Face's
  // layout).
  // `tensor` names it in errors; every piece written is checked to be finite first
  // (check_finite_tensor), `step` naming the checkpoint.
  void place(size_t array, ParamRange segment, size_t file, uint64_t offset, std::string tensor,
             size_t transposed_cols = 0);
  void set_step(int64_t step) { step_ = step; }
  // The arrays' elements [range.begin, range.end), range.size() floats each (null: an array
  // not written here); elements outside every placed segment are skipped. Returns how many
  // floats it wrote.
  uint64_t write(ParamRange range, std::span<const float* const> arrays);
  // Makes every file durable (fsync) and closes it.
  void sync_and_close();
  const std::filesystem::path& path(size_t file) const;

 private:
  struct OpenFile;
  struct Segment {
    ParamRange flat;
    size_t file = 0;
    uint64_t offset = 0;
    size_t transposed_cols = 0;
    std::string tensor;
  };
  void write_segment_part(const Segment& segment, size_t first, size_t count, const float* data);

  std::vector<std::unique_ptr<OpenFile>> files_;
  std::vector<std::vector<Segment>> segments_;  // per array
  std::vector<float> column_;                   // scratch for a transposed column
  int64_t step_ = 0;
};

// The weight files of a checkpoint of `config` (model.safetensors or its shards) in `dir`,
// created (`create`) or opened to fill a part (the other ranks of a data-parallel run, each
// writing its partition), with the fp32 params placed in them as array 0. Returns the
// files' names, in order.
std::vector<std::string> place_streamed_weights(StreamedFiles& files,
                                                const std::filesystem::path& dir,
                                                const TrainConfig& config, bool create);

// A one-rank training checkpoint streamed in pieces: the weights, optimizer.safetensors,
// config.json, trainer_state.json and the manifest, published as a synchronous save is.
class StreamedTrainingCheckpoint {
 public:
  // `state`: the checkpoint's config, step, data position and RNG (its arrays are not
  // read). Creates the staging directory and the tensor files.
  StreamedTrainingCheckpoint(const std::filesystem::path& checkpoints_root,
                             const TrainingState& state);
  ~StreamedTrainingCheckpoint();
  StreamedTrainingCheckpoint(const StreamedTrainingCheckpoint&) = delete;
  StreamedTrainingCheckpoint& operator=(const StreamedTrainingCheckpoint&) = delete;

  // The state arrays of the flat parameters [range.begin, range.end): arrays[0] the fp32
  // params, arrays[1 + k] optimizer array k (OptimizerFamily::state_names order), range.size()
  // floats each. Pieces must not overlap; together they cover every parameter once.
  void write(ParamRange range, std::span<const float* const> arrays);
  // Every parameter written: syncs and checksums the files, adds the small ones and the
  // manifest, and publishes the checkpoint (`latest` last). Returns its directory.
  std::filesystem::path publish();

 private:
  TrainingState state_;
  size_t num_arrays_ = 0;
  StagedCheckpoint staged_;
  StreamedFiles files_;
  std::vector<std::string> weight_files_;
  uint64_t floats_written_ = 0;
};

}  // namespace tandem
