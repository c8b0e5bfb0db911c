// A family's initialisation from a seed (Model::initial_params), on every family: any range
// gives the whole's values there (so a big model is initialised piece by piece), the same
// values at any thread count, each tensor by its family's rule (normals of the right spread,
// ones, zeros), and unrelated streams for other seeds and other chunks of a tensor. And the
// update engine's streamed load and read: the trainer's way for a model whose state fills
// host memory gives the bits of the whole-array way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/config/train_config.h"
#include "tandem/core/checksum.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/model/model_family.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/adamw/adamw_rule.h"

namespace tandem {
namespace {

// The shipped small configs of each family: biases (GPT-2's: zeros), norm weights (ones),
// normals of two spreads (GPT-2's residual projections), tensors of more than one chunk of
// normals (Llama's gate/up).
const char* const kConfigs[] = {"configs/shakespeare-char.json", "configs/llama-shakespeare.json"};

struct FamilyModel {
  explicit FamilyModel(const char* config_path)
      : config(load_train_config(testing::source_dir() / config_path, {}).model),
        backend(make_cpu_backend()),
        model(make_model(config, *backend, 1, 8)) {}
  ModelConfig config;
  std::unique_ptr<ComputeBackend> backend;
  std::unique_ptr<Model> model;
};

TEST(ModelInit, AnyRangeGivesTheWholesValues) {
  ThreadPool pool(2, false);
  for (const char* path : kConfigs) {
    FamilyModel f(path);
    const std::vector<float> whole = f.model->initial_params(1337);
    const size_t P = whole.size();
    ASSERT_GT(P, 3 * Model::kInitChunk) << path;
    // Ranges that start and end inside chunks and tensors, cross both, and single elements.
    const size_t C = Model::kInitChunk;
    std::vector<ParamRange> ranges = {{0, P},         {1, 2},
                                      {C - 3, C + 5}, {C / 2, 2 * C + 77},
                                      {P - 1, P},     {P / 3, P / 3 + 1000},
                                      {P / 2 + 13, P}};
    for (const ParamView& view : f.model->layout().views())  // across a tensor's own chunks
      if (view.numel > C) ranges.push_back({view.offset + C - 5, view.offset + C + 5});
    for (ParamRange r : ranges) {
      std::vector<float> piece(r.size(), -7.0f);
      f.model->initial_params(1337, r, piece.data(), pool);
      EXPECT_TRUE(std::equal(piece.begin(), piece.end(), whole.begin() + r.begin))
          << path << " [" << r.begin << ", " << r.end << ")";
    }
  }
}

TEST(ModelInit, TheSameValuesAtAnyThreadCount) {
  for (const char* path : kConfigs) {
    FamilyModel f(path);
    const size_t P = f.model->layout().num_elements();
    std::vector<float> one(P), three(P);
    ThreadPool alone(1, false), three_threads(3, false);
    f.model->initial_params(5, {0, P}, one.data(), alone);
    f.model->initial_params(5, {0, P}, three.data(), three_threads);
    EXPECT_EQ(checksum64(one.data(), one.size() * 4), checksum64(three.data(), three.size() * 4))
        << path;
  }
}

TEST(ModelInit, EachTensorByItsFamilysRule) {
  for (const char* path : kConfigs) {
    FamilyModel f(path);
    const std::vector<float> p = f.model->initial_params(11);
    const std::vector<float> other_seed = f.model->initial_params(12);
    for (const ParamView& view : f.model->layout().views()) {
      const Model::TensorInit init = f.model->tensor_init(view);
      const float* v = p.data() + view.offset;
      if (init.kind != Model::TensorInit::Kind::kNormal) {
        const float want = init.kind == Model::TensorInit::Kind::kOnes ? 1.0f : 0.0f;
        EXPECT_TRUE(std::all_of(v, v + view.numel, [&](float x) { return x == want; }))
            << view.name;
        continue;
      }
      double sum = 0, squares = 0;
      for (size_t i = 0; i < view.numel; i++) {
        sum += v[i];
        squares += static_cast<double>(v[i]) * v[i];
      }
      const double n = static_cast<double>(view.numel);
      const double mean = sum / n, std = std::sqrt(squares / n - mean * mean);
      // Sampling error of a mean and a standard deviation over n normals, with margin.
      EXPECT_NEAR(mean, 0.0, 6 * init.std / std::sqrt(n)) << view.name;
      EXPECT_NEAR(std, init.std, 6 * init.std / std::sqrt(2 * n) + 1e-6) << view.name;
      EXPECT_NE(v[0], other_seed[view.offset]) << view.name << ": the seed changes nothing";
      if (view.numel > Model::kInitChunk) {  // the second chunk is not the first again
        EXPECT_NE(v[0], v[Model::kInitChunk]) << view.name;
      }
    }
  }
}

// The trainer loads a fresh model's state from a fill (never the whole in host memory) and
// hashes it from a sink: the bits of load_state and read_state on whole arrays, for working
// copies in fp32 and bf16 and pieces that cross subgroups.
TEST(UpdateEngineStreaming, LoadAndReadInPiecesGiveTheWholeArraysBits) {
  const size_t P = 3 * UpdateEngine::kPieceFloats + 12345;
  ParamLayout layout;
  layout.add("w", {static_cast<int64_t>(P)}, true);
  std::vector<float> params(P), m(P), v(P);
  for (size_t i = 0; i < P; i++) {
    params[i] = static_cast<float>(i % 1000) * 1e-3f;
    m[i] = static_cast<float>(i % 77) * 1e-4f;
    v[i] = static_cast<float>(i % 13) * 1e-5f;
  }
  for (WorkingDType working : {WorkingDType::kF32, WorkingDType::kBF16}) {
    auto device = make_cpu_device({.memory_bytes = size_t{1} << 30});
    ThreadPool pool(1);
    const size_t elem = working == WorkingDType::kF32 ? 4 : 2;
    DeviceAllocation working_a = device->allocate(MemorySpace::kDevice, P * elem);
    DeviceAllocation working_b = device->allocate(MemorySpace::kDevice, P * elem);
    DeviceAllocation grads = device->allocate(MemorySpace::kDevice, P * 4);
    const OffloadPlan plan = make_offload_plan(
        {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 5000000, .stride = 2}, P);
    auto buffers = [&](DeviceAllocation& w) {
      return UpdateEngine::DeviceBuffers{
          .working_params = w.data(), .grads = grads.data(), .working_dtype = working};
    };
    UpdateEngine whole(*device, layout, plan, std::make_unique<AdamWRule>(AdamWHyper{}, pool),
                       buffers(working_a));
    UpdateEngine pieces(*device, layout, plan, std::make_unique<AdamWRule>(AdamWHyper{}, pool),
                        buffers(working_b));
    whole.load_state(params.data(), m.data(), v.data(), 4);
    const std::vector<const float*> arrays = {params.data(), m.data(), v.data()};
    size_t asked = 0;
    pieces.load_state(
        [&](size_t k, ParamRange range, float* out) {
          EXPECT_LE(range.size(), UpdateEngine::kPieceFloats);
          std::copy(arrays[k] + range.begin, arrays[k] + range.end, out);
          asked += range.size();
        },
        4);
    EXPECT_EQ(asked, 3 * P);
    EXPECT_EQ(pieces.step_count(), 4);
    EXPECT_EQ(checksum64(working_a.data(), P * elem), checksum64(working_b.data(), P * elem));
    std::vector<float> p2(P), m2(P), v2(P);
    pieces.read_state(p2.data(), m2.data(), v2.data());
    EXPECT_EQ(p2, params);
    EXPECT_EQ(m2, m);
    EXPECT_EQ(v2, v);
    // Streamed out: the arrays one after the other, in flat order.
    Checksum64Stream streamed;
    size_t expect_k = 0, expect_begin = 0;
    whole.read_state([&](size_t k, ParamRange range, const float* values) {
      if (k != expect_k) {
        EXPECT_EQ(expect_begin, P);
        expect_k = k;
        expect_begin = 0;
      }
      EXPECT_EQ(range.begin, expect_begin);
      expect_begin = range.end;
      streamed.update(values, range.size() * sizeof(float));
    });
    std::vector<float> all(params);
    all.insert(all.end(), m.begin(), m.end());
    all.insert(all.end(), v.begin(), v.end());
    EXPECT_EQ(streamed.digest(), checksum64(all.data(), all.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace tandem
