#include "tandem/ckpt/hf_weights.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace {

// [rows, cols] -> [cols, rows]
void transpose(const float* in, float* out, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) out[c * rows + r] = in[r * cols + c];
}

std::vector<int64_t> hf_shape(const ParamView& view) {
  if (!view.hf_transposed) return view.shape;
  return {view.shape[1], view.shape[0]};
}

}  // namespace

void write_hf_safetensors(const std::filesystem::path& path, const ParamLayout& layout,
                            const float* params) {
  WeightShard all{path.filename().string(), {}};
  for (size_t i = 0; i < layout.views().size(); i++) all.views.push_back(i);
  write_weight_shard(path, layout, params, all);
}

namespace {

void read_view(const SafetensorsFile& file, const ParamView& view, float* params,
               const std::string& prefix) {
  const std::string name = prefix + view.name;
  if (!view.hf_transposed) {
    file.copy_f32(name, view.shape, std::span<float>(params + view.offset, view.numel));
    return;
  }
  const std::vector<float> hf = file.read_f32(name, hf_shape(view));
  transpose(hf.data(), params + view.offset, view.shape[1], view.shape[0]);
}

std::string shard_name(size_t k, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
  return name;
}

}  // namespace

void read_hf_safetensors(const SafetensorsFile& file, const ParamLayout& layout, float* params,
                           const std::string& prefix) {
  for (const ParamView& view : layout.views()) read_view(file, view, params, prefix);
}

std::vector<WeightShard> plan_weight_shards(const ParamLayout& layout,
                                                 int64_t max_shard_bytes) {
  TANDEM_CHECK(max_shard_bytes >= 1, "max_shard_size must be at least 1 byte");
  const auto limit = static_cast<uint64_t>(max_shard_bytes);
  std::vector<WeightShard> plan;
  uint64_t total = 0;
  for (const ParamView& view : layout.views()) total += view.numel * sizeof(float);
  if (total <= limit) {
    WeightShard all{"model.safetensors", {}};
    for (size_t i = 0; i < layout.views().size(); i++) all.views.push_back(i);
    return {all};
  }
  uint64_t in_shard = 0;
  for (size_t i = 0; i < layout.views().size(); i++) {
    const uint64_t bytes = layout.views()[i].numel * sizeof(float);
    if (plan.empty() || (in_shard > 0 && in_shard + bytes > limit)) {
      plan.push_back({});
      in_shard = 0;
    }
    plan.back().views.push_back(i);
    in_shard += bytes;
  }
  for (size_t k = 0; k < plan.size(); k++) plan[k].file = shard_name(k + 1, plan.size());
  return plan;
}

namespace {

// The writer of `shard`'s file; `data` gives each view's tensor (in HF layout), or null
// when only the placement is wanted.
SafetensorsWriter shard_writer(const ParamLayout& layout, const WeightShard& shard,
                                    const std::function<const float*(const ParamView&)>& data) {
  SafetensorsWriter writer;
  for (size_t i : shard.views) {
    const ParamView& view = layout.views().at(i);
    writer.add(view.name, DType::kF32, hf_shape(view), data ? data(view) : nullptr);
  }
  writer.set_metadata("format", "pt");
  return writer;
}

}  // namespace

void write_weight_shard(const std::filesystem::path& path, const ParamLayout& layout,
                             const float* params, const WeightShard& shard) {
  std::vector<std::vector<float>> transposed;
  transposed.reserve(shard.views.size());
  shard_writer(layout, shard, [&](const ParamView& view) {
    const float* data = params + view.offset;
    if (!view.hf_transposed) return data;
    transposed.emplace_back(view.numel);
    transpose(data, transposed.back().data(), view.shape[0], view.shape[1]);
    return static_cast<const float*>(transposed.back().data());
  }).write(path);
}

SafetensorsWriter::Placement place_weight_shard(const ParamLayout& layout,
                                                     const WeightShard& shard) {
  return shard_writer(layout, shard, nullptr).placement(shard.file);
}

nlohmann::json weight_index(const ParamLayout& layout, const std::vector<WeightShard>& plan) {
  uint64_t total = 0;
  nlohmann::json map = nlohmann::json::object();
  for (const WeightShard& shard : plan)
    for (size_t i : shard.views) {
      map[layout.views().at(i).name] = shard.file;
      total += layout.views().at(i).numel * sizeof(float);
    }
  return {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
}

namespace {

nlohmann::json read_index(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kWeightIndexFile;
  try {
    nlohmann::json index = nlohmann::json::parse(read_file_text(path));
    TANDEM_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), path.string(),
                 ": no \"weight_map\" object; is this a Hugging Face safetensors index?");
    return index;
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace

std::vector<std::string> weight_files(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / kWeightIndexFile)) return {"model.safetensors"};
  std::vector<std::string> files = {kWeightIndexFile};
  const nlohmann::json index = read_index(dir);  // outlives the loop over its items
  for (const auto& [name, file] : index["weight_map"].items()) {
    const std::string f = file.get<std::string>();
    if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  }
  return files;
}

void read_hf_weights(const std::filesystem::path& dir, const ParamLayout& layout, float* params) {
  if (!std::filesystem::exists(dir / kWeightIndexFile)) {
    read_hf_safetensors(SafetensorsFile::read(dir / "model.safetensors"), layout, params);
    return;
  }
  const nlohmann::json map = read_index(dir)["weight_map"];
  std::map<std::string, std::vector<const ParamView*>> by_file;
  for (const ParamView& view : layout.views()) {
    TANDEM_CHECK(map.contains(view.name), (dir / kWeightIndexFile).string(), ": no entry for ",
                 view.name, "; the checkpoint does not hold this model's weights");
    by_file[map[view.name].get<std::string>()].push_back(&view);
  }
  for (const auto& [file, views] : by_file) {
    TANDEM_CHECK(file.find('/') == std::string::npos && file != ".." && !file.empty(),
                 (dir / kWeightIndexFile).string(), ": invalid shard name '", file, "'");
    const SafetensorsFile shard = SafetensorsFile::read(dir / file);
    for (const ParamView* view : views) read_view(shard, *view, params, "");
  }
}

}  // namespace tandem
