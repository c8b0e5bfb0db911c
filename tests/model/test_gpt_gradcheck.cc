// Finite-difference check of every parameter tensor's gradient on a tiny GPT.
//
// For each tensor we take a random unit direction d over its elements and compare
// the analytic directional derivative g . d with the central difference
// (L(p + eps d) - L(p - eps d)) / (2 eps). A direction covers every element at once,
// so one pair of forward passes checks the whole tensor; a few single elements per
// tensor are checked too.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "support/model_checks.h"
#include "tandem/compute/compute_backend.h"
#include "tandem/core/rng.h"
#include "tandem/device/device.h"
#include "tandem/model/gpt.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace {

struct TinySetup {
  ModelConfig config{
      .vocab_size = 37, .context_length = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
  int B = 2, T = 7;
  std::vector<int32_t> tokens, targets;
  std::vector<float> params;
};

TinySetup make_setup(const ParamLayout& layout) {
  TinySetup s;
  Rng rng(42);
  for (int i = 0; i < s.B * s.T; i++) {
    s.tokens.push_back(static_cast<int32_t>(rng.next_u64() % s.config.vocab_size));
    s.targets.push_back(static_cast<int32_t>(rng.next_u64() % s.config.vocab_size));
  }
  // Random everything (not the GPT-2 init): LayerNorm weights away from 1 and
  // non-zero biases exercise every term of the backward pass.
  s.params.resize(layout.num_elements());
  for (const ParamView& view : layout.views()) {
    const bool ln_weight =
        view.name.find(".ln_") != std::string::npos && view.name.ends_with("weight");
    for (size_t i = 0; i < view.numel; i++)
      s.params[view.offset + i] = (ln_weight ? 1.0f : 0.0f) + 0.3f * rng.normal();
  }
  return s;
}

// The tiny model with its random parameters set and one forward + backward done.
struct TinyModel {
  std::unique_ptr<ComputeBackend> backend = make_cpu_backend();
  TinySetup s;
  Gpt model{s.config, *backend, s.B, s.T};
  std::vector<float> grads;

  TinyModel() {
    s = make_setup(model.layout());
    model.set_params(s.params);
    model.zero_grads();
    model.forward(s.tokens.data(), s.targets.data(), s.B, s.T);
    model.backward();
    grads = model.grads_to_host();
  }
};

TEST(GptGradcheck, EveryTensorMatchesCentralDifferences) {
  TinyModel tiny;
  TinySetup& s = tiny.s;
  Gpt& model = tiny.model;
  const std::vector<float>& grads = tiny.grads;

  auto loss_at = [&](const std::vector<float>& p) {
    model.set_params(p);
    return static_cast<double>(model.forward(s.tokens.data(), s.targets.data(), s.B, s.T));
  };
  testing::expect_central_differences(model.layout(), s.params, grads, loss_at);
}

TEST(GptGradcheck, BackwardAccumulatesScaledGradients) {
  TinyModel tiny;
  TinySetup& s = tiny.s;
  Gpt& model = tiny.model;
  const std::vector<float> once = tiny.grads;
  model.zero_grads();
  for (int micro = 0; micro < 2; micro++) {
    model.forward(s.tokens.data(), s.targets.data(), s.B, s.T);
    model.backward(0.5f);
  }
  const std::vector<float> twice_half = model.grads_to_host();
  for (size_t i = 0; i < once.size(); i++)
    ASSERT_NEAR(once[i], twice_half[i], 1e-6f + 1e-5f * std::fabs(once[i])) << i;
}

TEST(GptMemory, ActivationBytesFormulaMatchesWhatTheModelAllocates) {
  auto backend = make_cpu_backend();
  const ModelConfig config{
      .vocab_size = 50, .context_length = 12, .n_layer = 3, .n_head = 2, .n_embd = 8};
  Gpt model(config, *backend, 3, 10);
  EXPECT_EQ(model.allocated_bytes(), 2 * sizeof(float) * model.layout().num_elements() +
                                         Gpt::activation_bytes(config, 3, 10));
}

TEST(GptMemory, TheModelsTensorsCountAgainstTheDevicesCapacity) {
  const ModelConfig config{
      .vocab_size = 50, .context_length = 12, .n_layer = 3, .n_head = 2, .n_embd = 8};
  const size_t needed = 2 * sizeof(float) * model_layout(config).num_elements() +
                        Gpt::activation_bytes(config, 3, 10);
  {
    auto device = make_cpu_device({.memory_bytes = needed});
    auto backend = make_cpu_backend(*device);
    Gpt model(config, *backend, 3, 10);
    EXPECT_EQ(device->device_in_use(), needed);
  }
  auto device = make_cpu_device({.memory_bytes = needed - 1});
  auto backend = make_cpu_backend(*device);
  EXPECT_THROW(Gpt(config, *backend, 3, 10), DeviceOutOfMemory);
  EXPECT_EQ(device->device_in_use(), 0u) << "a failed construction must give back what it took";
}

TEST(GptGradcheck, ShorterSequenceThanAllocatedGivesSameLoss) {
  auto backend = make_cpu_backend();
  TinySetup s;
  Gpt big(s.config, *backend, 4, 8);
  Gpt exact(s.config, *backend, s.B, s.T);
  s = make_setup(big.layout());
  big.set_params(s.params);
  exact.set_params(s.params);
  const float a = big.forward(s.tokens.data(), s.targets.data(), s.B, s.T);
  const float b = exact.forward(s.tokens.data(), s.targets.data(), s.B, s.T);
  EXPECT_EQ(a, b);
  EXPECT_GT(a, 0.0f);
}

}  // namespace
}  // namespace tandem
