#include "tandem/train/train_checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/ckpt/gpt2_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFormat = "tandem-trainer-state";
constexpr int kStateVersion = 1;

nlohmann::json state_json(const TrainingState& state) {
  nlohmann::json rng = nlohmann::json::array();
  // As strings: JSON readers elsewhere often hold numbers in doubles (53-bit).
  for (uint64_t word : state.sample_rng) rng.push_back(std::to_string(word));
  return {{"format", kStateFormat},
          {"version", kStateVersion},
          {"step", state.step},
          {"train_loader",
           {{"epoch", state.train_position.epoch}, {"batch", state.train_position.batch}}},
          {"sample_rng", rng},
          {"config", to_json(state.config)}};
}

void write_optimizer(const fs::path& path, const TrainingState& state, const ParamLayout& layout) {
  SafetensorsWriter writer;
  for (const ParamView& view : layout.views()) {
    writer.add("exp_avg." + view.name, DType::kF32, view.shape, state.exp_avg.data() + view.offset);
    writer.add("exp_avg_sq." + view.name, DType::kF32, view.shape,
               state.exp_avg_sq.data() + view.offset);
  }
  writer.set_metadata("step", std::to_string(state.step));
  writer.write(path);
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
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": malformed trainer state (", e.what(), ")");
  } catch (const Error& e) {
    fail(path.string(), ": ", e.what());
  }
  return state;
}

}  // namespace

std::vector<CheckpointFileWriter> training_checkpoint_files(const TrainingState& state,
                                                            bool with_optimizer) {
  const auto layout = std::make_shared<ParamLayout>(ParamLayout::gpt2(state.config.model));
  const size_t P = layout->num_elements();
  TANDEM_CHECK(state.params.size() == P &&
                   (!with_optimizer || (state.exp_avg.size() == P && state.exp_avg_sq.size() == P)),
               "checkpoint state does not match the model's ", P, " parameters");
  // The weights: one model.safetensors, or shards and their index past max_shard_size.
  const std::vector<WeightShard> shards =
      plan_gpt2_weight_shards(*layout, state.config.train.max_shard_size);
  std::vector<CheckpointFileWriter> files;
  for (const WeightShard& shard : shards)
    files.push_back({shard.file, [&state, layout, shard](const fs::path& p) {
                       write_gpt2_weight_shard(p, *layout, state.params.data(), shard);
                     }});
  if (shards.size() > 1)
    files.push_back({kWeightIndexFile, [layout, shards](const fs::path& p) {
                       write_file_atomic(p, gpt2_weight_index(*layout, shards).dump(2) + "\n");
                     }});
  const std::vector<CheckpointFileWriter> rest = {
      {"config.json",
       [&state](const fs::path& p) {
         write_file_atomic(p, hf_gpt2_config(state.config.model).dump(2) + "\n");
       }},
      {"trainer_state.json",
       [&state](const fs::path& p) { write_file_atomic(p, state_json(state).dump(2) + "\n"); }},
  };
  files.insert(files.end(), rest.begin(), rest.end());
  if (with_optimizer)
    files.push_back({"optimizer.safetensors",
                     [&state, layout](const fs::path& p) { write_optimizer(p, state, *layout); }});
  return files;
}

fs::path save_training_checkpoint(const fs::path& checkpoints_root, const TrainingState& state) {
  return save_checkpoint_dir(checkpoints_root, state.step, training_checkpoint_files(state, true));
}

TrainingState load_checkpoint_weights(const fs::path& path) {
  const fs::path dir = resolve_checkpoint(path);
  std::vector<std::string> files = gpt2_weight_files(dir);
  files.push_back("trainer_state.json");
  verify_checkpoint(dir, files);
  TrainingState state = read_state(dir);
  const ParamLayout layout = ParamLayout::gpt2(state.config.model);
  state.params.resize(layout.num_elements());
  read_gpt2_weights(dir, layout, state.params.data());
  return state;
}

TrainingState load_training_checkpoint(const fs::path& path) {
  return load_training_checkpoint(path, ParamRange{0, SIZE_MAX});
}

TrainingState load_training_checkpoint(const fs::path& path, ParamRange keep) {
  TrainingState state = load_checkpoint_weights(path);
  const fs::path dir = resolve_checkpoint(path);
  const ParamLayout layout = ParamLayout::gpt2(state.config.model);
  const size_t P = layout.num_elements();
  keep.end = std::min(keep.end, P);
  state.exp_avg.assign(P, 0.0f);
  state.exp_avg_sq.assign(P, 0.0f);
  const nlohmann::json manifest = checkpoint_manifest(dir);
  if (manifest.contains("optimizer_shards")) {
    // Written by the ranks of a data-parallel run: read the shards overlapping `keep`.
    const fs::path where = dir / "manifest.json";
    try {
      const nlohmann::json& sharded = manifest.at("optimizer_shards");
      TANDEM_CHECK(sharded.at("num_params").get<size_t>() == P, where.string(),
                   ": the optimizer shards cover ", sharded.at("num_params").get<size_t>(),
                   " parameters, the model has ", P);
      size_t covered = 0;
      for (const nlohmann::json& shard : sharded.at("shards")) {
        const std::string file = shard.at("file").get<std::string>();
        const size_t begin = shard.at("begin").get<size_t>(), end = shard.at("end").get<size_t>();
        TANDEM_CHECK(begin <= end && end <= P, where.string(), ": shard ", file, " covers [", begin,
                     ", ", end, "), outside the ", P, " parameters");
        covered += end - begin;
        const size_t b = std::max(begin, keep.begin), e = std::min(end, keep.end);
        if (b >= e) continue;
        verify_checkpoint(dir, {file});
        const SafetensorsFile f = SafetensorsFile::read(dir / file);
        const std::vector<int64_t> shape = {static_cast<int64_t>(end - begin)};
        const std::vector<float> m = f.read_f32("exp_avg", shape);
        const std::vector<float> v = f.read_f32("exp_avg_sq", shape);
        std::copy(m.begin() + (b - begin), m.begin() + (e - begin), state.exp_avg.begin() + b);
        std::copy(v.begin() + (b - begin), v.begin() + (e - begin), state.exp_avg_sq.begin() + b);
      }
      TANDEM_CHECK(covered == P, where.string(), ": the optimizer shards cover ", covered, " of ",
                   P, " parameters; the checkpoint is incomplete — use another checkpoint");
    } catch (const nlohmann::json::exception& e) {
      fail(where.string(), ": malformed optimizer_shards (", e.what(), ")");
    }
    return state;
  }
  verify_checkpoint(dir, {"optimizer.safetensors"});
  const SafetensorsFile optimizer = SafetensorsFile::read(dir / "optimizer.safetensors");
  for (const ParamView& view : layout.views()) {
    optimizer.copy_f32("exp_avg." + view.name, view.shape,
                       std::span<float>(state.exp_avg.data() + view.offset, view.numel));
    optimizer.copy_f32("exp_avg_sq." + view.name, view.shape,
                       std::span<float>(state.exp_avg_sq.data() + view.offset, view.numel));
  }
  return state;
}

}  // namespace tandem
