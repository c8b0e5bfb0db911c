// Activation checkpointing in the model (ModelOwnBuffers::recompute_interval), on every
// family and storage type: keeping every k-th layer's output and recomputing the rest
// inside backward gives the loss and every gradient bit for bit, announces the blocks'
// gradients in the same order, and allocates what the family's activation_bytes says,
// less than keeping every layer.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/test_util.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/rng.h"
#include "tandem/model/gpt.h"
#include "tandem/model/llama.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace {

constexpr int kB = 2, kT = 12;

// Five layers; Llama's with grouped-query heads (4 on 2) and an untied head.
ModelConfig five_layers(ModelType type) {
  ModelConfig config;
  config.type = type;
  config.vocab_size = 37;
  config.context_length = 16;
  config.n_layer = 5;
  config.n_head = type == ModelType::kLlama ? 4 : 2;
  config.n_embd = 16;
  if (type == ModelType::kLlama) {
    config.n_kv_head = 2;
    config.intermediate_size = 24;
    config.tie_word_embeddings = false;
  }
  config.validate();
  return config;
}

struct Pass {
  float loss = 0;
  std::vector<float> grads;
  std::vector<std::pair<size_t, size_t>> ready;  // the blocks' gradients, in announced order
  size_t allocated = 0;
};

// One forward and backward of a fixed batch from the same seed's weights, twice over (the
// second pass must not depend on what the first left in the recompute buffers).
Pass run(ModelType type, StorageDType dtype, int recompute_interval, bool kept_on_host = false) {
  const ModelConfig config = five_layers(type);
  std::unique_ptr<ComputeBackend> backend = make_cpu_backend();
  const std::unique_ptr<Model> owner = make_model(
      config, *backend, kB, kT, dtype,
      {.recompute_interval = recompute_interval, .recompute_kept_on_host = kept_on_host});
  Model& model = *owner;
  model.init_weights(5);
  Rng rng(11);
  std::vector<int32_t> tokens(kB * kT), targets(kB * kT);
  for (size_t i = 0; i < tokens.size(); i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % config.vocab_size);
    targets[i] = static_cast<int32_t>(rng.next_u64() % config.vocab_size);
  }
  Pass pass;
  for (int repeat = 0; repeat < 2; repeat++) {
    model.zero_grads();
    pass.loss = model.forward(tokens.data(), targets.data(), kB, kT);
    pass.ready.clear();
    model.backward(0.5f, [&](size_t begin, size_t end) { pass.ready.emplace_back(begin, end); });
  }
  pass.grads = model.grads_to_host();
  pass.allocated = model.allocated_bytes();
  return pass;
}

class Recompute : public ::testing::TestWithParam<std::tuple<ModelType, StorageDType>> {
 protected:
  ModelType type() const { return std::get<0>(GetParam()); }
  StorageDType dtype() const { return std::get<1>(GetParam()); }
  Pass run(int recompute_interval, bool kept_on_host = false) const {
    return tandem::run(type(), dtype(), recompute_interval, kept_on_host);
  }
};

TEST_P(Recompute, EveryIntervalGivesTheLossAndGradientsBitForBit) {
  const Pass kept = run(0);
  ASSERT_GT(kept.loss, 1.0f);
  for (int interval : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE(interval);
    const Pass recomputed = run(interval);
    EXPECT_EQ(std::memcmp(&recomputed.loss, &kept.loss, sizeof(float)), 0)
        << recomputed.loss << " vs " << kept.loss;
    ASSERT_EQ(recomputed.grads.size(), kept.grads.size());
    EXPECT_EQ(
        std::memcmp(recomputed.grads.data(), kept.grads.data(), kept.grads.size() * sizeof(float)),
        0);
    EXPECT_EQ(recomputed.ready, kept.ready);
  }
}

// cpu_checkpointing: the kept outputs go to pinned host memory in forward and come back,
// two segments ahead, in backward; two device rows hold them in between. The same bits, and
// the device keeps two outputs instead of one per segment.
TEST_P(Recompute, KeptOutputsOnTheHostGiveTheSameBitsInTwoDeviceRows) {
  const Pass kept = run(0);
  const ModelConfig config = five_layers(type());
  const size_t row = static_cast<size_t>(kB) * kT * config.n_embd * storage_dtype_bytes(dtype());
  const size_t params = model_layout(config).num_elements() * 2 * storage_dtype_bytes(dtype());
  for (int interval : {1, 2, 3}) {  // 5, 3 and 2 segments
    SCOPED_TRACE(interval);
    const Pass on_host = run(interval, true);
    EXPECT_EQ(std::memcmp(&on_host.loss, &kept.loss, sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(on_host.grads.data(), kept.grads.data(), kept.grads.size() * 4), 0);
    EXPECT_EQ(on_host.ready, kept.ready);
    const size_t segments = (config.n_layer + interval - 1) / interval;
    const size_t on_device = model_activation_bytes(config, kB, kT, dtype(), interval);
    const size_t with_host = model_activation_bytes(config, kB, kT, dtype(), interval, true);
    EXPECT_EQ(on_device - with_host, (segments - std::min<size_t>(segments, 2)) * row);
    EXPECT_EQ(on_host.allocated, params + with_host);
    EXPECT_EQ(model_kept_output_host_bytes(config, kB, kT, dtype(), interval), segments * row);
  }
  std::unique_ptr<ComputeBackend> backend = make_cpu_backend();
  EXPECT_CONTAINS(testing::error_of([&] {
                    make_model(config, *backend, kB, kT, dtype(), {.recompute_kept_on_host = true});
                  }),
                  "need a recompute interval");
}

TEST_P(Recompute, AllocatesWhatActivationBytesSaysAndLessThanKeepingEveryLayer) {
  const StorageDType dtype = this->dtype();
  const ModelConfig config = five_layers(type());
  const size_t params = model_layout(config).num_elements() * 2 * storage_dtype_bytes(dtype);
  // One segment of all five layers keeps as much as no recompute; shorter ones keep less.
  size_t previous = model_activation_bytes(config, kB, kT, dtype, 0);
  EXPECT_EQ(run(0).allocated, params + previous);
  for (int interval : {5, 3, 2, 1}) {
    SCOPED_TRACE(interval);
    const size_t bytes = model_activation_bytes(config, kB, kT, dtype, interval);
    EXPECT_EQ(run(interval).allocated, params + bytes);
    if (interval == 5) {
      EXPECT_EQ(bytes, previous);
    } else {
      EXPECT_LT(bytes, previous);
    }
    previous = bytes;
  }
  // Interval 1 keeps one layer's activations but its output instead of five (every
  // layer's output is kept): GPT-2's 17 C elements and 4 + NH floats a position, Llama's
  // 6 C + W + 3 I elements and 2 + NH floats.
  const size_t BT = static_cast<size_t>(kB) * kT, C = config.n_embd, NH = config.n_head;
  const size_t W = config.qkv_width(), I = config.mlp_width();
  const size_t e = storage_dtype_bytes(dtype);
  const size_t layer_but_output = type() == ModelType::kGpt2
                                      ? BT * (17 * C * e + (4 + NH) * 4)
                                      : BT * ((6 * C + W + 3 * I) * e + (2 + NH) * 4);
  EXPECT_EQ(model_activation_bytes(config, kB, kT, dtype, 0) -
                model_activation_bytes(config, kB, kT, dtype, 1),
            (config.n_layer - 1) * layer_but_output);
  EXPECT_EQ(model_activation_bytes(config, kB, kT, dtype, 8),
            model_activation_bytes(config, kB, kT, dtype, 5));
}

TEST(RecomputeInterval, ANegativeOneIsRefused) {
  std::unique_ptr<ComputeBackend> backend = make_cpu_backend();
  for (ModelType type : {ModelType::kGpt2, ModelType::kLlama})
    EXPECT_CONTAINS(testing::error_of([&] {
                      make_model(five_layers(type), *backend, kB, kT, StorageDType::kF32,
                                 {.recompute_interval = -1});
                    }),
                    "recompute interval -1");
}

INSTANTIATE_TEST_SUITE_P(FamiliesAndDtypes, Recompute,
                         ::testing::Combine(::testing::Values(ModelType::kGpt2, ModelType::kLlama),
                                            ::testing::Values(StorageDType::kF32,
                                                              StorageDType::kBF16)),
                         [](const auto& info) {
                           return cat(model_type_name(std::get<0>(info.param)), "_",
                                      storage_dtype_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace tandem
