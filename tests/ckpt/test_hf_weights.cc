// stream_hf_weights (what a resume reads weights with) against read_hf_weights (the whole
// file in memory), on a GPT-2 layout whose Conv1D weights are transposed on disk: one file,
// a sharded plan with its index, and a file with GPT-2's published names (no "transformer."
// prefix). Every byte of every file goes to the observer once; a tensor of the wrong shape or
// a missing one is refused, naming it and the file.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;
using testing::error_of;
using testing::ScratchDir;

ModelConfig small_gpt() {
  ModelConfig config;
  config.vocab_size = 40;
  config.context_length = 16;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 24;
  return config;
}

std::vector<float> some_params(const ParamLayout& layout) {
  std::vector<float> params(layout.num_elements());
  for (size_t i = 0; i < params.size(); i++) params[i] = std::sin(0.37f * static_cast<float>(i));
  return params;
}

// stream_hf_weights over plain files, counting the bytes each file's observer saw.
std::vector<float> streamed(const fs::path& dir, const ParamLayout& layout,
                            std::map<std::string, uint64_t>* observed = nullptr) {
  std::vector<float> params(layout.num_elements(), -7.0f);
  stream_hf_weights(
      dir, layout, params.data(), [&](const std::string& file, const WeightFileRead& read) {
        File in(dir / file, "rb");
        uint64_t seen = 0;
        read(in, fs::file_size(dir / file), [&](const void*, size_t n) { seen += n; });
        if (observed != nullptr) (*observed)[file] = seen;
      });
  return params;
}

TEST(HfWeights, StreamingReadsTheBitsTheWholeFileReaderReads) {
  const ParamLayout layout = model_layout(small_gpt());
  const std::vector<float> params = some_params(layout);
  bool any_transposed = false;
  for (const ParamView& view : layout.views()) any_transposed |= view.hf_transposed;
  ASSERT_TRUE(any_transposed) << "the layout was meant to hold Conv1D weights";

  const ScratchDir one("hf_stream_one");
  write_hf_safetensors(one / "model.safetensors", layout, params.data());
  std::map<std::string, uint64_t> observed;
  EXPECT_EQ(streamed(one.path(), layout, &observed), params);
  EXPECT_EQ(observed.at("model.safetensors"), fs::file_size(one / "model.safetensors"));
  std::vector<float> whole(params.size());
  read_hf_weights(one.path(), layout, whole.data());
  EXPECT_EQ(whole, params);

  // Sharded, as a checkpoint with a small max_shard_size holds them.
  const ScratchDir sharded("hf_stream_sharded");
  const std::vector<WeightShard> plan = plan_weight_shards(layout, 4096);
  ASSERT_GT(plan.size(), 2u);
  for (const WeightShard& shard : plan) {
    File out(sharded / shard.file, "wb");
    write_weight_shard(out, layout, params.data(), shard);
  }
  write_file_atomic(sharded / kWeightIndexFile, weight_index(layout, plan).dump());
  observed.clear();
  EXPECT_EQ(streamed(sharded.path(), layout, &observed), params);
  EXPECT_EQ(observed.size(), plan.size());

  // GPT-2's published names: the tensors without the base model's prefix.
  const SafetensorsFile full = SafetensorsFile::read(one / "model.safetensors");
  SafetensorsWriter bare;
  std::vector<std::vector<uint8_t>> keep;
  for (const std::string& name : full.names()) {
    const auto bytes = full.bytes(name);
    keep.emplace_back(bytes.begin(), bytes.end());
    const std::string stored = name.starts_with("transformer.") ? name.substr(12) : name;
    bare.add(stored, DType::kF32, full.info(name).shape, keep.back().data());
  }
  const ScratchDir published("hf_stream_published");
  bare.write(published / "model.safetensors");
  EXPECT_EQ(streamed(published.path(), layout), params);
}

TEST(HfWeights, StreamingRefusesAWrongShapeOrAMissingTensorNamingIt) {
  const ParamLayout layout = model_layout(small_gpt());
  const ScratchDir dir("hf_stream_bad");
  const std::vector<float> values(40 * 24, 0.5f);
  SafetensorsWriter writer;
  writer.add("transformer.wte.weight", DType::kF32, {24, 40}, values.data());  // [V, C] swapped
  writer.write(dir / "model.safetensors");
  const std::string wrong = error_of([&] { streamed(dir.path(), layout); });
  EXPECT_CONTAINS(wrong, "model.safetensors");
  EXPECT_CONTAINS(wrong, "transformer.wte.weight");
  EXPECT_CONTAINS(wrong, "shape");

  SafetensorsWriter partial;
  partial.add("transformer.wte.weight", DType::kF32, {40, 24}, values.data());
  partial.write(dir / "model.safetensors");
  const std::string missing = error_of([&] { streamed(dir.path(), layout); });
  EXPECT_CONTAINS(missing, "model.safetensors");
  EXPECT_CONTAINS(missing, "transformer.wpe.weight");
}

}  // namespace
}  // namespace tandem
