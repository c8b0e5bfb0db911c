#include "tandem/ckpt/hf_weights.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/transpose.h"

namespace tandem {
namespace {

std::vector<int64_t> hf_shape(const ParamView& view) {
  if (!view.hf_transposed) return view.shape;
  return {view.shape[1], view.shape[0]};
}

}  // namespace

void write_hf_safetensors(const std::filesystem::path& path, const ParamLayout& layout,
                          const float* params) {
  WeightShard all{path.filename().string(), {}};
  for (size_t i = 0; i < layout.views().size(); i++) all.views.push_back(i);
  AtomicFileWriter out(path);
  write_weight_shard(out.file(), layout, params, all);
  out.commit();
}

namespace {

// The name a tensor has in a file: its Hugging Face name, or that name without the base
// model's prefix, as GPT-2's published checkpoints store it ("h.0.attn.c_attn.weight" for
// "transformer.h.0.attn.c_attn.weight").
std::string stored_name(const ParamView& view, const std::function<bool(const std::string&)>& has) {
  constexpr std::string_view kGpt2Base = "transformer.";
  if (!has(view.name) && view.name.starts_with(kGpt2Base)) {
    std::string bare = view.name.substr(kGpt2Base.size());
    if (has(bare)) return bare;
  }
  return view.name;
}

void read_view(const SafetensorsFile& file, const ParamView& view, float* params,
               const std::string& prefix) {
  const std::string name =
      prefix.empty() ? stored_name(view, [&](const std::string& n) { return file.contains(n); })
                     : prefix + view.name;
  if (!view.hf_transposed) {
    file.copy_widened_f32(name, view.shape, std::span<float>(params + view.offset, view.numel));
    return;
  }
  std::vector<float> hf(view.numel);
  file.copy_widened_f32(name, hf_shape(view), hf);
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

std::vector<WeightShard> plan_weight_shards(const ParamLayout& layout, int64_t max_shard_bytes) {
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

// The layout of `shard`'s file (its tensors in Hugging Face's shapes; their bytes are
// written by write_hf_tensor, in this order).
SafetensorsWriter shard_layout(const ParamLayout& layout, const WeightShard& shard) {
  SafetensorsWriter writer;
  for (size_t i : shard.views) {
    const ParamView& view = layout.views().at(i);
    writer.add(view.name, DType::kF32, hf_shape(view), nullptr);
  }
  writer.set_metadata("format", "pt");
  return writer;
}

// Writes `view`'s tensor (`data`, tandem layout) in Hugging Face's: as it is, or, for a
// Conv1D weight ([out, in] here, [in, out] there), transposed one band of its rows at a time
// through `band`, so that no copy of the whole weight is made.
void write_hf_tensor(File& out, const ParamView& view, const float* data,
                     std::vector<float>& band) {
  if (!view.hf_transposed) {
    out.write_all(data, view.numel * sizeof(float));
    return;
  }
  const int64_t rows = view.shape[0], cols = view.shape[1];
  // Hugging Face's row j is our column j; a band is about 1 MiB of them.
  const int64_t band_rows = std::max<int64_t>(1, (int64_t{1} << 18) / rows);
  band.resize(static_cast<size_t>(band_rows * rows));
  for (int64_t j0 = 0; j0 < cols; j0 += band_rows) {
    const int64_t j1 = std::min(cols, j0 + band_rows);
    transpose_rows(data, rows, cols, j0, j1, band.data());
    out.write_all(band.data(), static_cast<size_t>((j1 - j0) * rows) * sizeof(float));
  }
}

}  // namespace

void write_weight_shard(File& out, const ParamLayout& layout, const float* params,
                        const WeightShard& shard) {
  write_weight_shard(out, layout, shard,
                     [params](const ParamView& view) { return params + view.offset; });
}

void write_weight_shard(File& out, const ParamLayout& layout, const WeightShard& shard,
                        const ViewValues& values_of) {
  // The header as the writer lays it out, then the tensors packed in the shard's order.
  out.write_all(place_weight_shard(layout, shard).prefix);
  std::vector<float> band;
  for (size_t i : shard.views) {
    const ParamView& view = layout.views().at(i);
    write_hf_tensor(out, view, values_of(view), band);
  }
}

SafetensorsWriter::Placement place_weight_shard(const ParamLayout& layout,
                                                const WeightShard& shard) {
  return shard_layout(layout, shard).placement(shard.file);
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

namespace {

// Which views sit in which weight file of `dir`: all in model.safetensors, or as its index
// maps them.
std::map<std::string, std::vector<const ParamView*>> views_by_file(const std::filesystem::path& dir,
                                                                   const ParamLayout& layout) {
  std::map<std::string, std::vector<const ParamView*>> by_file;
  if (!std::filesystem::exists(dir / kWeightIndexFile)) {
    for (const ParamView& view : layout.views()) by_file["model.safetensors"].push_back(&view);
    return by_file;
  }
  const nlohmann::json map = read_index(dir)["weight_map"];
  for (const ParamView& view : layout.views()) {
    const std::string name =
        stored_name(view, [&](const std::string& n) { return map.contains(n); });
    TANDEM_CHECK(map.contains(name), (dir / kWeightIndexFile).string(), ": no entry for ",
                 view.name, "; the checkpoint does not hold this model's weights");
    const std::string file = map[name].get<std::string>();
    TANDEM_CHECK(file.find('/') == std::string::npos && file != ".." && !file.empty(),
                 (dir / kWeightIndexFile).string(), ": invalid shard name '", file, "'");
    by_file[file].push_back(&view);
  }
  return by_file;
}

}  // namespace

void read_hf_weights(const std::filesystem::path& dir, const ParamLayout& layout, float* params,
                     const WeightFileReader& read) {
  const auto open = [&](const std::string& file) {
    return SafetensorsFile::parse(read ? read(file) : read_file_bytes(dir / file),
                                  (dir / file).string());
  };
  if (!std::filesystem::exists(dir / kWeightIndexFile)) {
    read_hf_safetensors(open("model.safetensors"), layout, params);
    return;
  }
  for (const auto& [file, views] : views_by_file(dir, layout)) {
    const SafetensorsFile shard = open(file);
    for (const ParamView* view : views) read_view(shard, *view, params, "");
  }
}

void stream_hf_weights(const std::filesystem::path& dir, const ParamLayout& layout,
                       const ParamSink& sink, const WeightFileOpener& open,
                       const ParamPlace& place) {
  std::vector<float> conv1d, band;  // one Conv1D weight in Hugging Face's layout; rows of ours
  for (const auto& [file, views] : views_by_file(dir, layout)) {
    // A tensor is found under its view's name or, as in GPT-2's published files, without
    // the base model's prefix (stored_name).
    std::map<std::string, const ParamView*> by_name;
    for (const ParamView* view : views) {
      by_name[view->name] = view;
      by_name[stored_name(*view, [&](const std::string& n) { return n != view->name; })] = view;
    }
    const std::string source = (dir / file).string();
    open(file, [&](File& in, uint64_t bytes,
                   const std::function<void(const void*, size_t)>& observe) {
      const SafetensorsFile header = SafetensorsFile::read_pieces(
          in, bytes, source,
          [&](const TensorInfo& tensor) {
            const auto it = by_name.find(tensor.name);
            if (it == by_name.end()) return false;  // not this model's: skipped
            SafetensorsFile::check_tensor(source, tensor, DType::kF32, hf_shape(*it->second));
            return true;
          },
          observe,
          [&](const TensorInfo& tensor, uint64_t at, std::span<const uint8_t> piece) {
            const ParamView& view = *by_name.at(tensor.name);
            const auto* values = reinterpret_cast<const float*>(piece.data());
            const size_t first = at / sizeof(float), n = piece.size() / sizeof(float);
            if (!view.hf_transposed) {
              sink({view.offset + first, view.offset + first + n}, values);
              return;
            }
            // Hugging Face's [in, out], read into conv1d (below): whole before our [out, in]
            // rows can be made from it.
            if (first + n < view.numel) return;
            const int64_t rows = view.shape[0], cols = view.shape[1];
            const int64_t band_rows = std::max<int64_t>(1, (int64_t{1} << 18) / cols);
            band.resize(static_cast<size_t>(band_rows * cols));
            for (int64_t r0 = 0; r0 < rows; r0 += band_rows) {
              const int64_t r1 = std::min(rows, r0 + band_rows);
              transpose_rows(conv1d.data(), cols, rows, r0, r1, band.data());
              sink({view.offset + static_cast<size_t>(r0 * cols),
                    view.offset + static_cast<size_t>(r1 * cols)},
                   band.data());
            }
          },
          [&](const TensorInfo& tensor, uint64_t at, size_t n) -> uint8_t* {
            const ParamView& view = *by_name.at(tensor.name);
            if (view.hf_transposed) {
              conv1d.resize(view.numel);
              return reinterpret_cast<uint8_t*>(conv1d.data()) + at;
            }
            const size_t first = view.offset + at / sizeof(float);
            return place ? reinterpret_cast<uint8_t*>(place({first, first + n / sizeof(float)}))
                         : nullptr;
          });
      for (const ParamView* view : views)  // each one there (throws naming the first missing)
        header.info(stored_name(*view, [&](const std::string& n) { return header.contains(n); }));
    });
  }
}

void stream_hf_weights(const std::filesystem::path& dir, const ParamLayout& layout, float* params,
                       const WeightFileOpener& open) {
  stream_hf_weights(
      dir, layout,
      [params](ParamRange range, const float* values) {
        // Read in place, but for a Conv1D weight's transposed bands.
        if (values != params + range.begin)
          std::copy(values, values + range.size(), params + range.begin);
      },
      open, [params](ParamRange range) { return params + range.begin; });
}

}  // namespace tandem
