// A model's weights in Hugging Face's safetensors layout (the names and shapes of its
// ParamLayout), so a tandem checkpoint loads in `transformers` (from_pretrained on the
// checkpoint directory: GPT2LMHeadModel, LlamaForCausalLM) and a Hugging Face checkpoint
// loads in tandem.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/ckpt/safetensors.h"
#include "tandem/model/param_layout.h"
#include "tandem/model/param_range.h"

namespace tandem {

// Writes params (host, flat, tandem layout) as F32 tensors with Hugging Face names.
// Conv1D weights (ParamView::hf_transposed) are written transposed, [in, out].
void write_hf_safetensors(const std::filesystem::path& path, const ParamLayout& layout,
                          const float* params);

// Fills params (host, flat, tandem layout) from a file with Hugging Face names and
// layout. Errors name the file and the missing or mis-shaped tensor. A `prefix` reads
// tensors stored as prefix + name (e.g. "grad." in test fixtures).
void read_hf_safetensors(const SafetensorsFile& file, const ParamLayout& layout, float* params,
                         const std::string& prefix = "");

// The weight files of a checkpoint, as Hugging Face's save_pretrained cuts them: one
// model.safetensors when the tensors take at most max_shard_bytes, else shards
// model-00001-of-0000n.safetensors of whole tensors in layout order (a tensor larger than
// the limit alone in its shard) and model.safetensors.index.json mapping each name to its
// shard. `views` index layout.views().
struct WeightShard {
  std::string file;
  std::vector<size_t> views;
};
std::vector<WeightShard> plan_weight_shards(const ParamLayout& layout, int64_t max_shard_bytes);
inline constexpr const char* kWeightIndexFile = "model.safetensors.index.json";

// Writes the tensors of `shard` (all of them for the one-file plan) into `out`, in order.
void write_weight_shard(File& out, const ParamLayout& layout, const float* params,
                        const WeightShard& shard);
// The same with each view's values (tandem layout, view.numel floats) from `values_of`,
// asked once per view in the shard's order; a pointer need stay valid only until the next
// call.
using ViewValues = std::function<const float*(const ParamView& view)>;
void write_weight_shard(File& out, const ParamLayout& layout, const WeightShard& shard,
                        const ViewValues& values_of);
// Where write_weight_shard puts `shard`'s bytes: its header and, in the order of
// shard.views, each tensor's file offset (Hugging Face layout: a Conv1D weight transposed).
SafetensorsWriter::Placement place_weight_shard(const ParamLayout& layout,
                                                const WeightShard& shard);
// The index for a sharded plan: {"metadata": {"total_size"}, "weight_map": {name: file}}.
nlohmann::json weight_index(const ParamLayout& layout, const std::vector<WeightShard>& plan);

// The weight files in `dir`: {"model.safetensors"}, or the index and every shard it names.
std::vector<std::string> weight_files(const std::filesystem::path& dir);
// The bytes of a weight file of a directory, by its name (a checkpoint's reader verifies
// them as it reads: ckpt/checkpoint_dir.h, read_verified_file).
using WeightFileReader = std::function<std::vector<uint8_t>(const std::string& file)>;
// Reads params (host, flat, tandem layout) from a directory holding either form; each file
// through `read` (empty: read as it is).
void read_hf_weights(const std::filesystem::path& dir, const ParamLayout& layout, float* params,
                     const WeightFileReader& read = {});
// Opens a weight file of a directory, by name, and has `read` read it: the file open at its
// start, its size, and an observer for every byte read (a checkpoint's reader checksums
// them as they come: ckpt/checkpoint_dir.h, read_verified).
using WeightFileRead =
    std::function<void(File& in, uint64_t bytes, const std::function<void(const void*, size_t)>&)>;
using WeightFileOpener = std::function<void(const std::string& file, const WeightFileRead& read)>;
// read_hf_weights for tandem's own fp32 weight files, with bounded memory: each file is read
// once, front to back, and its tensors handed to `sink` in pieces of the flat params
// (tandem layout) as they are read, a few MiB at a time; a Conv1D weight is gathered whole
// (the only buffer of a tensor's size) and handed over transposed, a band of rows at a time.
// The pieces cover every parameter once; `values` is valid during the call. `place`, if
// set, may name host memory of a piece's size to read it straight into (null: through the
// buffer), which `sink` is then handed as `values`: where the params end up, to save a copy.
using ParamSink = std::function<void(ParamRange range, const float* values)>;
using ParamPlace = std::function<float*(ParamRange range)>;
void stream_hf_weights(const std::filesystem::path& dir, const ParamLayout& layout,
                       const ParamSink& sink, const WeightFileOpener& open,
                       const ParamPlace& place = {});
// The same into params (host, flat, tandem layout).
void stream_hf_weights(const std::filesystem::path& dir, const ParamLayout& layout, float* params,
                       const WeightFileOpener& open);

}  // namespace tandem
