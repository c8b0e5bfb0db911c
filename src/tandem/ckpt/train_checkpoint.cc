#include "tandem/ckpt/train_checkpoint.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/huge_pages.h"
#include "tandem/model/model_family.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFormat = "tandem-trainer-state";
constexpr int kStateVersion = 1;

nlohmann::json state_json(const TrainingState& state) {
  nlohmann::json rng = nlohmann::json::array();
  // As strings: JSON readers elsewhere often hold numbers in doubles (53-bit).
  for (uint64_t word : state.sample_rng) rng.push_back(std::to_string(word));
  nlohmann::json json = {
      {"format", kStateFormat},
      {"version", kStateVersion},
      {"step", state.step},
      {"train_loader",
       {{"epoch", state.train_position.epoch}, {"batch", state.train_position.batch}}},
      {"sample_rng", rng}};
  if (!state.train_tokens_xxh3.empty())
    json["run"] = {{"train_tokens", state.train_tokens},
                   {"train_tokens_xxh3", state.train_tokens_xxh3},
                   {"world_size", state.world_size}};
  if (!state.lineage.id.empty())
    json["lineage"] = {{"id", state.lineage.id}, {"ancestors", state.lineage.ancestors}};
  json["config"] = to_json(state.config);
  return json;
}

CheckpointLineage lineage_of_json(const nlohmann::json& json) {
  CheckpointLineage lineage;
  if (!json.contains("lineage")) return lineage;
  lineage.id = json.at("lineage").at("id").get<std::string>();
  lineage.ancestors = json.at("lineage").at("ancestors").get<std::vector<std::string>>();
  return lineage;
}

// optimizer.safetensors from `arrays`: the header optimizer_file_writer lays out, then each
// view's optimizer arrays in its order, each checked finite as it goes out.
void write_optimizer(File& out, const TrainingState& state, const ParamLayout& layout,
                     const StateSource& arrays) {
  const std::vector<std::string> names =
      optimizer_family(state.config.optimizer.type).state_names();
  const SafetensorsWriter::Placement placement =
      optimizer_file_writer(state.without_arrays(), layout).placement("optimizer.safetensors");
  out.write_all(placement.prefix);
  std::vector<float> scratch;
  size_t tensor = 0;
  for (const ParamView& view : layout.views())
    for (size_t k = 0; k < names.size(); k++) {
      // The tensors are packed in this order (the placement the reader checks).
      TANDEM_CHECK(out.bytes_written() == placement.offsets.at(tensor++),
                   "optimizer.safetensors: ", names[k], ".", view.name,
                   " is not where its header puts it");
      scratch.resize(view.numel);
      const float* values = arrays(1 + k, {view.offset, view.offset + view.numel}, scratch.data());
      check_finite_tensor(names[k] + "." + view.name, values, view.numel, state.step);
      out.write_all(values, view.numel * sizeof(float));
    }
}

// Reads trainer_state.json into everything but the tensors.
TrainingState read_state(const fs::path& dir) {
  const fs::path path = dir / "trainer_state.json";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(read_file_text(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": not valid JSON (", e.what(), ")");
  }
  TrainingState state;
  try {
    TANDEM_CHECK(json.at("format") == kStateFormat && json.at("version") == kStateVersion,
                 path.string(), ": not a tandem trainer state of version ", kStateVersion);
    state.config = parse_train_config(json.at("config"));
    state.step = json.at("step").get<int64_t>();
    state.train_position.epoch = json.at("train_loader").at("epoch").get<uint64_t>();
    state.train_position.batch = json.at("train_loader").at("batch").get<uint64_t>();
    const auto& rng = json.at("sample_rng");
    TANDEM_CHECK(rng.is_array() && rng.size() == 4, path.string(),
                 ": sample_rng must hold 4 words");
    for (size_t i = 0; i < 4; i++) state.sample_rng[i] = std::stoull(rng[i].get<std::string>());
    if (json.contains("run")) {
      const nlohmann::json& run = json.at("run");
      state.train_tokens = run.at("train_tokens").get<uint64_t>();
      state.train_tokens_xxh3 = run.at("train_tokens_xxh3").get<std::string>();
      state.world_size = run.at("world_size").get<int>();
    }
    state.lineage = lineage_of_json(json);
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": malformed trainer state (", e.what(), ")");
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
  return state;
}

}  // namespace

void check_finite_tensor(const std::string& tensor, const float* data, size_t n, int64_t step) {
  // NaN and the infinities are the floats whose exponent bits are all ones: a branch-free OR
  // over each block's bits (which the compiler vectorises: the scan runs at memory speed on
  // every save), and only in a block that has one, the search for the first.
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr size_t kBlock = 4096;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    uint32_t any = 0;
    for (size_t i = begin; i < end; i++)
      any |= static_cast<uint32_t>((std::bit_cast<uint32_t>(data[i]) & kExponent) == kExponent);
    if (any == 0) continue;
    for (size_t i = begin; i < end; i++)
      if (!std::isfinite(data[i]))
        fail("refusing to save step ", step, ": ", tensor, "[", i, "] = ", data[i], " ",
             kNotFiniteMessage, ", and a checkpoint holding it could not be resumed");
  }
}

SafetensorsWriter optimizer_file_writer(const TrainingState& state, const ParamLayout& layout) {
  const std::vector<std::string> names =
      optimizer_family(state.config.optimizer.type).state_names();
  SafetensorsWriter writer;
  for (const ParamView& view : layout.views())
    for (size_t k = 0; k < names.size(); k++)
      writer.add(names[k] + "." + view.name, DType::kF32, view.shape,
                 k < state.optimizer_state.size() ? state.optimizer_state[k].data() + view.offset
                                                  : nullptr);
  writer.set_metadata("step", std::to_string(state.step));
  writer.set_metadata("optimizer", std::string(optimizer_type_name(state.config.optimizer.type)));
  return writer;
}

// The files of a Hugging Face model directory besides config.json and the weights that a
// fine-tune keeps: its tokenizer and its generation defaults, so that every checkpoint of a
// run from train.init_from loads with its tokenizer.
constexpr const char* kHfCompanionFiles[] = {"tokenizer.json", "tokenizer_config.json",
                                             "special_tokens_map.json", "generation_config.json",
                                             "chat_template.jinja"};

std::vector<CheckpointFileWriter> training_checkpoint_json_files(const TrainingState& state) {
  std::vector<CheckpointFileWriter> files = {
      {"config.json",
       [&state](File& out) {
         out.write_all(
             model_family(state.config.model.type).to_hf_config(state.config.model).dump(2) + "\n");
       }},
      {"trainer_state.json",
       [&state](File& out) { out.write_all(state_json(state).dump(2) + "\n"); }},
  };
  const std::string& init_from = state.config.train.init_from;
  if (init_from.empty()) return files;
  for (const char* name : kHfCompanionFiles) {
    const std::filesystem::path source = std::filesystem::path(init_from) / name;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(source, ec)) continue;
    files.push_back({name, [source](File& out) { out.write_all(read_file_text(source)); }});
  }
  return files;
}

namespace {

// The files of a checkpoint of `state` (all but its arrays) with the arrays from `arrays`;
// both must outlive the writers.
std::vector<CheckpointFileWriter> checkpoint_files_from(const TrainingState& state,
                                                        const StateSource& arrays,
                                                        bool with_optimizer) {
  const auto layout = std::make_shared<ParamLayout>(model_layout(state.config.model));
  // The weights: one model.safetensors, or shards and their index past max_shard_size.
  const std::vector<WeightShard> shards =
      plan_weight_shards(*layout, state.config.train.max_shard_size);
  std::vector<CheckpointFileWriter> files;
  for (const WeightShard& shard : shards)
    files.push_back({shard.file, [&state, &arrays, layout, shard](File& out) {
                       std::vector<float> scratch;
                       write_weight_shard(out, *layout, shard, [&](const ParamView& view) {
                         scratch.resize(view.numel);
                         const float* values =
                             arrays(0, {view.offset, view.offset + view.numel}, scratch.data());
                         check_finite_tensor(view.name, values, view.numel, state.step);
                         return values;
                       });
                     }});
  if (shards.size() > 1)
    files.push_back({kWeightIndexFile, [layout, shards](File& out) {
                       out.write_all(weight_index(*layout, shards).dump(2) + "\n");
                     }});
  const std::vector<CheckpointFileWriter> rest = training_checkpoint_json_files(state);
  files.insert(files.end(), rest.begin(), rest.end());
  if (with_optimizer)
    files.push_back({"optimizer.safetensors", [&state, &arrays, layout](File& out) {
                       write_optimizer(out, state, *layout, arrays);
                     }});
  return files;
}

}  // namespace

std::vector<CheckpointFileWriter> training_checkpoint_files(const TrainingState& state,
                                                            bool with_optimizer) {
  const ParamLayout layout = model_layout(state.config.model);
  const size_t P = layout.num_elements();
  bool sizes_match = state.params.size() == P;
  if (with_optimizer) {
    sizes_match =
        sizes_match && state.optimizer_state.size() ==
                           optimizer_family(state.config.optimizer.type).state_names().size();
    for (const std::vector<float>& array : state.optimizer_state)
      sizes_match = sizes_match && array.size() == P;
  }
  TANDEM_CHECK(sizes_match, "checkpoint state does not match the model's ", P, " parameters");
  // The source outlives the writers: they hold it.
  auto vectors = std::make_shared<StateSource>(arrays_source(state));
  std::vector<CheckpointFileWriter> files = checkpoint_files_from(state, *vectors, with_optimizer);
  for (CheckpointFileWriter& file : files)
    file.write = [write = std::move(file.write), vectors](File& out) { write(out); };
  return files;
}

StateSource arrays_source(const TrainingState& state) {
  return [&state](size_t array, ParamRange range, float*) {
    const std::vector<float>& values =
        array == 0 ? state.params : state.optimizer_state.at(array - 1);
    return values.data() + range.begin;
  };
}

fs::path save_training_checkpoint(const fs::path& checkpoints_root, const TrainingState& state) {
  return save_checkpoint_dir(checkpoints_root, state.step, training_checkpoint_files(state, true));
}

fs::path save_training_checkpoint(const fs::path& checkpoints_root, const TrainingState& state,
                                  const StateSource& arrays) {
  return save_checkpoint_dir(checkpoints_root, state.step,
                             checkpoint_files_from(state, arrays, true));
}

TrainingState read_training_state(const fs::path& path) {
  const fs::path dir = resolve_checkpoint(path);
  // The small files verified first; the arrays as they are read (read_verified).
  std::vector<std::string> small = {"trainer_state.json"};
  for (const std::string& file : weight_files(dir))
    if (file == kWeightIndexFile) small.push_back(file);
  verify_checkpoint(dir, small);
  return read_state(dir);
}

TrainingState load_checkpoint_weights(const fs::path& path) {
  TrainingState state = read_training_state(path);
  const fs::path dir = resolve_checkpoint(path);
  resize_on_huge_pages(state.params, model_layout(state.config.model).num_elements());
  stream_hf_weights(dir, model_layout(state.config.model), state.params.data(),
                    [&dir](const std::string& file, const WeightFileRead& read) {
                      read_verified(dir, file, read);
                    });
  return state;
}

ResumableCheckpoint newest_checkpoint_with_weights(const fs::path& path) {
  CheckpointChoice choice{.lineage_of = checkpoint_lineage,
                          .files_read =
                              [](const fs::path& dir) {
                                std::vector<std::string> files = {"trainer_state.json"};
                                for (std::string& file : weight_files(dir))
                                  files.push_back(std::move(file));
                                return files;
                              },
                          .use = "sample",
                          .if_none = "there is no intact checkpoint to sample from"};
  return newest_verified_checkpoint(path, choice);
}

TrainingState TrainingState::without_arrays() const {
  TrainingState out;
  out.config = config;
  out.step = step;
  out.train_position = train_position;
  out.sample_rng = sample_rng;
  out.train_tokens_xxh3 = train_tokens_xxh3;
  out.train_tokens = train_tokens;
  out.world_size = world_size;
  out.lineage = lineage;
  return out;
}

CheckpointLineage checkpoint_lineage(const fs::path& checkpoint_dir) {
  const fs::path path = checkpoint_dir / "trainer_state.json";
  try {
    return lineage_of_json(nlohmann::json::parse(read_file_text(path)));
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": malformed trainer state (", e.what(), ")");
  }
}

const std::vector<float>& TrainingState::optimizer_array(const std::string& name) const {
  const std::vector<std::string> names = optimizer_family(config.optimizer.type).state_names();
  for (size_t k = 0; k < names.size() && k < optimizer_state.size(); k++)
    if (names[k] == name) return optimizer_state[k];
  fail("the ", optimizer_type_name(config.optimizer.type), " optimizer keeps no state array '",
       name, "'");
}

namespace {

// Where a tensor of an optimizer file goes: state array `array` (1 + the optimizer's k) from
// flat index `begin`, `shape` as the writer laid it out.
struct OptimizerTensor {
  size_t array;
  size_t begin;
  std::vector<int64_t> shape;
};

// Reads one optimizer file of `dir` front to back, checksummed as it is read, handing each
// listed tensor to `sink` in pieces clipped to `keep` (every listed tensor must be there).
uint64_t stream_optimizer_file(const fs::path& dir, const std::string& file,
                               const std::map<std::string, OptimizerTensor>& tensors,
                               ParamRange keep, const StateSink& sink, const StatePlace& place) {
  const std::string source = (dir / file).string();
  uint64_t read = 0;
  read_verified(dir, file, [&](File& in, uint64_t bytes, const auto& observe) {
    read = bytes;
    const SafetensorsFile header = SafetensorsFile::read_pieces(
        in, bytes, source,
        [&](const TensorInfo& tensor) {
          const auto it = tensors.find(tensor.name);
          if (it == tensors.end()) return false;
          SafetensorsFile::check_tensor(source, tensor, DType::kF32, it->second.shape);
          return true;
        },
        observe,
        [&](const TensorInfo& tensor, uint64_t at, std::span<const uint8_t> piece) {
          const OptimizerTensor& to = tensors.at(tensor.name);
          const auto* values = reinterpret_cast<const float*>(piece.data());
          const size_t b = to.begin + at / sizeof(float);
          const size_t e = b + piece.size() / sizeof(float);
          const size_t kb = std::max(b, keep.begin), ke = std::min(e, keep.end);
          if (kb < ke) sink(to.array, {kb, ke}, values + (kb - b));
        },
        [&](const TensorInfo& tensor, uint64_t at, size_t n) -> uint8_t* {
          const OptimizerTensor& to = tensors.at(tensor.name);
          const size_t b = to.begin + at / sizeof(float), e = b + n / sizeof(float);
          if (!place || b < keep.begin || e > keep.end) return nullptr;
          return reinterpret_cast<uint8_t*>(place(to.array, {b, e}));
        });
    for (const auto& [name, tensor] : tensors) header.info(name);  // each one there
  });
  return read;
}

}  // namespace

uint64_t stream_training_arrays(const fs::path& path, const TrainingState& state,
                                const OptimizerStateSlice& slice, const StateSink& sink,
                                const StatePlace& place) {
  const fs::path dir = resolve_checkpoint(path);
  const ParamLayout layout = model_layout(state.config.model);
  const size_t P = layout.num_elements();
  uint64_t read = 0;
  stream_hf_weights(
      dir, layout, [&sink](ParamRange range, const float* values) { sink(0, range, values); },
      [&](const std::string& file, const WeightFileRead& read_file) {
        read_verified(dir, file, [&](File& in, uint64_t bytes, const auto& observe) {
          read += bytes;
          read_file(in, bytes, observe);
        });
      },
      place ? ParamPlace([&place](ParamRange range) { return place(0, range); }) : ParamPlace());
  const std::vector<std::string> names =
      optimizer_family(state.config.optimizer.type).state_names();
  const bool per_rank = optimizer_family(state.config.optimizer.type).state_per_rank;
  // A rank's own state is whole; partitioned state only its part.
  const ParamRange keep =
      per_rank ? ParamRange{0, P} : ParamRange{slice.keep.begin, std::min(slice.keep.end, P)};
  const nlohmann::json manifest = checkpoint_manifest(dir);
  if (!manifest.contains("optimizer_shards")) {
    TANDEM_CHECK(!per_rank || slice.world_size == 1, dir.string(), ": the checkpoint holds the ",
                 optimizer_type_name(state.config.optimizer.type),
                 " state of one rank (every rank keeps its own); resume it with 1 rank, not ",
                 slice.world_size);
    std::map<std::string, OptimizerTensor> tensors;
    for (const ParamView& view : layout.views())
      for (size_t k = 0; k < names.size(); k++)
        tensors[names[k] + "." + view.name] = {1 + k, view.offset, view.shape};
    return read + stream_optimizer_file(dir, "optimizer.safetensors", tensors, keep, sink, place);
  }
  // Written by the ranks of a data-parallel run: the shards overlapping `keep`, or this
  // rank's own.
  const fs::path where = dir / "manifest.json";
  struct Shard {
    std::string file;
    size_t begin, end;
  };
  std::vector<Shard> shards;
  try {
    const nlohmann::json& sharded = manifest.at("optimizer_shards");
    TANDEM_CHECK(sharded.at("num_params").get<size_t>() == P, where.string(),
                 ": the optimizer shards cover ", sharded.at("num_params").get<size_t>(),
                 " parameters, the model has ", P);
    if (per_rank) {
      const int world = sharded.at("world_size").get<int>();
      TANDEM_CHECK(world == slice.world_size, dir.string(), ": the checkpoint holds the ",
                   optimizer_type_name(state.config.optimizer.type), " state of each of ", world,
                   " ranks (every rank keeps its own); resume it with ", world, " ranks, not ",
                   slice.world_size);
      for (const nlohmann::json& shard : sharded.at("shards"))
        if (shard.at("rank").get<int>() == slice.rank)
          shards.push_back({shard.at("file").get<std::string>(), 0, P});
      TANDEM_CHECK(!shards.empty(), where.string(), ": no optimizer shard of rank ", slice.rank,
                   "; the checkpoint is incomplete — use another checkpoint");
      shards.resize(1);
    } else {
      size_t covered = 0;
      for (const nlohmann::json& shard : sharded.at("shards")) {
        const std::string file = shard.at("file").get<std::string>();
        const size_t begin = shard.at("begin").get<size_t>(), end = shard.at("end").get<size_t>();
        TANDEM_CHECK(begin <= end && end <= P, where.string(), ": shard ", file, " covers [", begin,
                     ", ", end, "), outside the ", P, " parameters");
        covered += end - begin;
        if (std::max(begin, keep.begin) < std::min(end, keep.end))
          shards.push_back({file, begin, end});
      }
      TANDEM_CHECK(covered == P, where.string(), ": the optimizer shards cover ", covered, " of ",
                   P, " parameters; the checkpoint is incomplete — use another checkpoint");
    }
  } catch (const nlohmann::json::exception& e) {
    fail(where.string(), ": malformed optimizer_shards (", e.what(), ")");
  }
  for (const Shard& shard : shards) {
    std::map<std::string, OptimizerTensor> tensors;
    for (size_t k = 0; k < names.size(); k++)
      tensors[names[k]] = {1 + k, shard.begin, {static_cast<int64_t>(shard.end - shard.begin)}};
    read += stream_optimizer_file(dir, shard.file, tensors, keep, sink, place);
  }
  return read;
}

TrainingState load_training_checkpoint(const fs::path& path, const OptimizerStateSlice& slice) {
  TrainingState state = read_training_state(path);
  const size_t P = model_layout(state.config.model).num_elements();
  // Each array made once, on huge pages before the first byte lands; state outside `keep`
  // stays zero.
  resize_on_huge_pages(state.params, P);
  state.optimizer_state.resize(optimizer_family(state.config.optimizer.type).state_names().size());
  for (std::vector<float>& array : state.optimizer_state) resize_on_huge_pages(array, P);
  const auto at = [&state](size_t array, ParamRange range) {
    return (array == 0 ? state.params : state.optimizer_state.at(array - 1)).data() + range.begin;
  };
  // Read in place, but for a Conv1D weight's transposed bands.
  stream_training_arrays(
      path, state, slice,
      [&at](size_t array, ParamRange range, const float* values) {
        float* to = at(array, range);
        if (values != to) std::copy(values, values + range.size(), to);
      },
      at);
  return state;
}

}  // namespace tandem
