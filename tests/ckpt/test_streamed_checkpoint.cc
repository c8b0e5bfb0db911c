// A checkpoint streamed in pieces (ckpt/streamed_checkpoint.h) is the synchronous save,
// byte for byte, whatever the pieces and their order: pieces that cut a transposed
// Conv1D weight mid-row, single floats, sharded weights, DeMo's arrays. A resume streams
// it back in bounded pieces (stream_training_arrays).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/ckpt/streamed_checkpoint.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/rng.h"
#include "tandem/model/model_family.h"
#include "tandem/model/param_layout.h"
#include "tandem/optim/optimizer_family.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

TrainingState random_state(const nlohmann::json& json, uint64_t seed) {
  TrainingState state;
  state.config = parse_train_config(json);
  state.step = 42;
  state.train_position = {.epoch = 1, .batch = 3};
  state.sample_rng = {1, 2, 3, 0xfedcba9876543210ull};
  const size_t P = model_layout(state.config.model).num_elements();
  state.params = testing::randn(P, seed);
  for (size_t k = 0; k < optimizer_family(state.config.optimizer.type).state_names().size(); k++)
    state.optimizer_state.push_back(testing::randn(P, seed + 1 + k));
  return state;
}

// DeMo's state (one array) and weights cut into several shards with an index.
void as_demo_with_sharded_weights(nlohmann::json& json) {
  json["train"]["max_shard_size"] = 5000;  // bytes
  json["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 1e-3}}}};
}

// Cuts [0, P) into pieces of the given sizes (cycled) and shuffles them.
std::vector<ParamRange> pieces(size_t P, const std::vector<size_t>& sizes, uint64_t seed) {
  std::vector<ParamRange> out;
  for (size_t b = 0, i = 0; b < P; i++) {
    const size_t e = std::min(P, b + sizes[i % sizes.size()]);
    out.push_back({b, e});
    b = e;
  }
  Rng rng(seed);
  for (size_t i = out.size(); i > 1; i--) std::swap(out[i - 1], out[rng.next_u64() % i]);
  return out;
}

void stream(const fs::path& root, const TrainingState& state, const std::vector<ParamRange>& cut) {
  StreamedTrainingCheckpoint checkpoint(root, state);
  for (const ParamRange& r : cut) {
    // Each piece from a buffer of its own, as a pool slot holds it.
    std::vector<std::vector<float>> slot;
    slot.emplace_back(state.params.begin() + r.begin, state.params.begin() + r.end);
    for (const std::vector<float>& array : state.optimizer_state)
      slot.emplace_back(array.begin() + r.begin, array.begin() + r.end);
    std::vector<const float*> arrays;
    for (const std::vector<float>& a : slot) arrays.push_back(a.data());
    checkpoint.write(r, arrays);
  }
  checkpoint.publish();
}

void expect_same_files(const fs::path& a, const fs::path& b) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(a))
    names.push_back(e.path().filename().string());
  std::vector<std::string> other;
  for (const fs::directory_entry& e : fs::directory_iterator(b))
    other.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::sort(other.begin(), other.end());
  ASSERT_EQ(names, other);
  for (const std::string& name : names)
    EXPECT_EQ(read_file_bytes(a / name), read_file_bytes(b / name)) << name;
}

TEST(StreamedCheckpoint, AnyPiecesInAnyOrderGiveTheSynchronousSaveByteForByte) {
  testing::ScratchDir dir("streamed");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  const TrainingState state = random_state(json, 5);
  const size_t P = state.params.size();
  const fs::path sync = save_training_checkpoint(dir / "sync", state);
  // 7 and 1 cut the [48, 16] and [64, 16] Conv1D weights mid-row and mid-column; the
  // large sizes span several tensors at once.
  const std::vector<std::vector<size_t>> cuts = {{P}, {7, 1, 1000}, {1}, {4099, 333, 16}};
  for (size_t c = 0; c < cuts.size(); c++) {
    const fs::path root = dir / ("streamed_" + std::to_string(c));
    stream(root, state, pieces(P, cuts[c], c));
    SCOPED_TRACE("cut " + std::to_string(c));
    expect_same_files(sync, root / sync.filename());
    EXPECT_EQ(read_file_text(root / "latest"), read_file_text(dir / "sync" / "latest"));
    verify_checkpoint(root / sync.filename());
  }
}

TEST(StreamedCheckpoint, ShardedWeightsAndDemoStateToo) {
  testing::ScratchDir dir("streamed_sharded");
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  as_demo_with_sharded_weights(json);
  const TrainingState state = random_state(json, 9);
  ASSERT_EQ(state.optimizer_state.size(), 1u);
  const fs::path sync = save_training_checkpoint(dir / "sync", state);
  ASSERT_TRUE(fs::exists(sync / "model.safetensors.index.json"));
  stream(dir / "streamed", state, pieces(state.params.size(), {513, 2}, 3));
  expect_same_files(sync, dir / "streamed" / sync.filename());
}

// A synchronous save that reads each tensor from where the state lives (the update
// engine's memory; here a source that hands out pointers into the arrays for the params and
// fills the scratch for the optimizer's) writes the files of the save from whole arrays.
TEST(SourcedCheckpoint, ASaveFromWhereTheStateLivesIsTheSynchronousSaveByteForByte) {
  testing::ScratchDir dir("sourced");
  for (const bool demo : {false, true}) {
    nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
    if (demo) as_demo_with_sharded_weights(json);
    const TrainingState state = random_state(json, demo ? 3 : 4);
    const fs::path sync = save_training_checkpoint(dir / cat("sync_", demo), state);
    size_t asked = 0;
    const fs::path sourced = save_training_checkpoint(
        dir / cat("sourced_", demo), state.without_arrays(),
        [&](size_t array, ParamRange range, float* scratch) -> const float* {
          asked += range.size();
          if (array == 0) return state.params.data() + range.begin;
          const std::vector<float>& values = state.optimizer_state.at(array - 1);
          std::copy(values.begin() + range.begin, values.begin() + range.end, scratch);
          return scratch;
        });
    SCOPED_TRACE(demo ? "DeMo, sharded weights" : "AdamW");
    expect_same_files(sync, sourced);
    verify_checkpoint(sourced);
    EXPECT_EQ(asked, state.params.size() * (1 + state.optimizer_state.size()));  // each once
  }
}

// A resume streams a checkpoint's files into the engine with bounded memory: every element
// of every array comes once, with the bits saved, in pieces of at most one read's 4 MiB
// though tensors are larger (a Conv1D weight, gathered whole to transpose it, comes in
// bands); the optimizer state from one file, or from the weights' shards and DeMo's.
TEST(StreamedResume, EveryElementComesOnceInBoundedPiecesWithTheSavedBits) {
  testing::ScratchDir dir("streamed_resume");
  for (const bool demo : {false, true}) {
    nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
    if (demo) {
      as_demo_with_sharded_weights(json);
    } else {
      json["model"]["n_layer"] = 1;
      json["model"]["n_embd"] = 640;  // mlp.c_fc.weight: 1.6 M floats, 6.5 MB
    }
    SCOPED_TRACE(demo ? "DeMo, sharded weights" : "AdamW");
    const TrainingState state = random_state(json, demo ? 6 : 7);
    const size_t P = state.params.size();
    const fs::path saved = save_training_checkpoint(dir / cat("ckpt_", demo), state);
    const size_t arrays = 1 + state.optimizer_state.size();
    std::vector<std::vector<float>> got(arrays, std::vector<float>(P, -1.0f));
    std::vector<std::vector<uint8_t>> times(arrays, std::vector<uint8_t>(P, 0));
    size_t largest = 0;
    stream_training_arrays(saved, read_training_state(saved), {},
                           [&](size_t array, ParamRange range, const float* values) {
                             ASSERT_LT(array, arrays);
                             ASSERT_LE(range.end, P);
                             largest = std::max(largest, range.size());
                             std::copy(values, values + range.size(),
                                       got[array].begin() + range.begin);
                             for (size_t i = range.begin; i < range.end; i++) times[array][i]++;
                           });
    for (size_t k = 0; k < arrays; k++) {
      EXPECT_EQ(std::count(times[k].begin(), times[k].end(), 1), static_cast<ptrdiff_t>(P)) << k;
      EXPECT_TRUE(got[k] == (k == 0 ? state.params : state.optimizer_state[k - 1])) << k;
    }
    constexpr size_t kReadFloats = (size_t{4} << 20) / sizeof(float);
    EXPECT_LE(largest, kReadFloats);
    if (!demo) {
      const ParamLayout layout = model_layout(state.config.model);
      EXPECT_TRUE(std::any_of(
          layout.views().begin(), layout.views().end(),
          [&](const ParamView& view) { return view.hf_transposed && view.numel > kReadFloats; }));
    }
  }
}

// A file whose bytes differ from the manifest's checksum is refused, named, once read.
TEST(StreamedResume, ADamagedFileIsRefusedNamingIt) {
  testing::ScratchDir dir("streamed_resume_damaged");
  const TrainingState state =
      random_state(testing::tiny_run_config(dir / "data.txt", dir / "run"), 8);
  const fs::path saved = save_training_checkpoint(dir / "ckpt", state);
  {
    std::vector<uint8_t> bytes = read_file_bytes(saved / "optimizer.safetensors");
    bytes[bytes.size() - 3] ^= 0x10;  // a bit of the last tensor's last float
    File out(saved / "optimizer.safetensors", "wb");
    out.write_all(bytes.data(), bytes.size());
  }
  const std::string error = testing::error_of([&] {
    stream_training_arrays(saved, read_training_state(saved), {},
                           [](size_t, ParamRange, const float*) {});
  });
  EXPECT_CONTAINS(error, "optimizer.safetensors: checksum mismatch");
  EXPECT_CONTAINS(error, "use another checkpoint");
}

TEST(StreamedCheckpoint, MissingPiecesAreRefusedAndLeaveNothing) {
  testing::ScratchDir dir("streamed_missing");
  const TrainingState state =
      random_state(testing::tiny_run_config(dir / "data.txt", dir / "run"), 2);
  {
    StreamedTrainingCheckpoint checkpoint(dir / "ckpt", state);
    const float* arrays[] = {state.params.data(), state.optimizer_state[0].data(),
                             state.optimizer_state[1].data()};
    checkpoint.write({0, 100}, arrays);
    EXPECT_THROW(checkpoint.write({0, state.params.size() + 1}, arrays), Error);
    try {
      checkpoint.publish();
      ADD_FAILURE() << "published with pieces missing";
    } catch (const Error& e) {
      EXPECT_PRED_FORMAT2(testing::contains, e.what(), "wrote 300 of the checkpoint's");
    }
  }
  // The staging directory went with it: nothing under the root looks like a checkpoint.
  EXPECT_TRUE(fs::is_empty(dir / "ckpt"));
}

TEST(StreamedCheckpoint, AFullDiskFailsBeforeTheFirstPieceNamingTheFile) {
  testing::ScratchDir dir("streamed_full");
  const TrainingState state =
      random_state(testing::tiny_run_config(dir / "data.txt", dir / "run"), 4);
  {
    const testing::FileSizeLimit limit(1000);
    try {
      StreamedTrainingCheckpoint checkpoint(dir / "ckpt", state);
      ADD_FAILURE() << "the files fit in 1000 bytes?";
    } catch (const Error& e) {
      EXPECT_PRED_FORMAT2(testing::contains, e.what(), "model.safetensors: cannot reserve");
    }
  }
  EXPECT_TRUE(fs::is_empty(dir / "ckpt"));
}

}  // namespace
}  // namespace tandem
