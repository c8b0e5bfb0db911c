// Checks of a model against its references, shared by the families' tests
// (test_gpt2_fixture / test_llama_fixture, test_gpt_gradcheck / test_llama_model).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/hf_weights.h"
#include "tandem/ckpt/safetensors.h"
#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/model/model.h"
#include "tandem/offload/update_engine.h"
#include "tandem/optim/adamw/adamw_rule.h"
#include "tandem/optim/grad_clip.h"

namespace tandem::testing {

// A fixture written by tools/make_<family>_fixture.py (tests/fixtures/<name>.safetensors):
// one batch, the sizes and hyper-parameters in the metadata, the initial parameters under
// their Hugging Face names, and copies prefixed "grad." (the gradients) and "adamw3." (the
// parameters after 3 clipped AdamW steps).
struct ModelFixture {
  SafetensorsFile file;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;

  explicit ModelFixture(const std::string& name)
      : file(SafetensorsFile::read(source_dir() / "tests" / "fixtures" / (name + ".safetensors"))),
        B(static_cast<int>(meta("batch_size"))),
        T(static_cast<int>(meta("seq_len"))),
        tokens(file.read_i32("tokens", {B, T})),
        targets(file.read_i32("targets", {B, T})) {}
  double meta(const char* key) const { return std::stod(file.metadata().at(key)); }
  // The tensors under `prefix` + their Hugging Face names, in the layout's flat order.
  std::vector<float> params(const ParamLayout& layout, const std::string& prefix = "") const {
    std::vector<float> p(layout.num_elements());
    read_hf_safetensors(file, layout, p.data(), prefix);
    return p;
  }
};

// Every gradient within 1e-7 + 1e-4 x its tensor's largest |reference| (fp32 against
// float64: tiny entries carry rounding noise). Every tensor must have a gradient.
inline void expect_gradients_near(const ParamLayout& layout, const std::vector<float>& grads,
                                  const std::vector<float>& expected) {
  for (const ParamView& view : layout.views()) {
    double max_abs = 0.0;
    for (size_t i = 0; i < view.numel; i++)
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(expected[view.offset + i])));
    ASSERT_GT(max_abs, 0.0) << view.name << " has no gradient in the reference";
    const double tolerance = 1e-7 + 1e-4 * max_abs;
    for (size_t i = 0; i < view.numel; i++)
      ASSERT_NEAR(grads[view.offset + i], expected[view.offset + i], tolerance)
          << view.name << "[" << i << "]";
  }
}

// One forward and backward pass of `model` (fp32, sized for the fixture's batch) from the
// fixture's parameters: the loss within 1e-5 relative, every logit within 2e-5 (+ 2e-5
// relative), every gradient as expect_gradients_near below (fp32 against float64).
inline void expect_logits_loss_and_gradients_match(Model& model, const ModelFixture& fx) {
  model.set_params(fx.params(model.layout()));
  model.zero_grads();
  const float loss = model.forward(fx.tokens.data(), fx.targets.data(), fx.B, fx.T);
  model.backward();

  const float expected_loss = fx.file.read_f32("loss", {})[0];
  EXPECT_NEAR(loss, expected_loss, 1e-5 * expected_loss);
  const std::vector<float> logits = model.logits_to_host();
  const std::vector<float> expected_logits =
      fx.file.read_f32("logits", {fx.B, fx.T, model.config().vocab_size});
  ASSERT_EQ(logits.size(), expected_logits.size());
  for (size_t i = 0; i < logits.size(); i++)
    ASSERT_NEAR(logits[i], expected_logits[i], 2e-5 + 2e-5 * std::fabs(expected_logits[i])) << i;

  expect_gradients_near(model.layout(), model.grads_to_host(), fx.params(model.layout(), "grad."));
}

// tandem's Hugging Face export of the fixture's parameters has the names, shapes and bytes
// of the tensors PyTorch wrote (Conv1D weights transposed as Hugging Face stores them).
inline void expect_export_is_the_fixtures_tensors(const ParamLayout& layout,
                                                  const ModelFixture& fx) {
  const std::vector<float> params = fx.params(layout);
  const ScratchDir dir("hf_export");
  const auto path = dir / "model.safetensors";
  write_hf_safetensors(path, layout, params.data());
  const SafetensorsFile written = SafetensorsFile::read(path);
  for (const ParamView& view : layout.views()) {
    ASSERT_EQ(written.info(view.name).shape, fx.file.info(view.name).shape) << view.name;
    const auto a = written.bytes(view.name);
    const auto b = fx.file.bytes(view.name);
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << view.name;
  }
}

// The PyTorch fixtures' optimizer check: 3 AdamW steps with global-norm clipping on one
// batch, run as training runs them (the update engine, interleaving CPU and cpu-device
// updates, which must not change a bit), each pre-clip norm against the fixture's
// grad_norm.step<k>. Hyper-parameters from the fixture's metadata. Returns the parameters
// after the 3 steps (fp32 model).
inline std::vector<float> three_clipped_adamw_steps(Model& model, const SafetensorsFile& fixture,
                                                    const std::vector<int32_t>& tokens,
                                                    const std::vector<int32_t>& targets, int B,
                                                    int T) {
  auto meta = [&](const char* key) { return std::stof(fixture.metadata().at(key)); };
  const AdamWHyper hyper{.lr = meta("lr"),
                         .beta1 = meta("beta1"),
                         .beta2 = meta("beta2"),
                         .eps = meta("eps"),
                         .weight_decay = meta("weight_decay")};
  const float max_norm = meta("max_norm");
  const size_t P = model.layout().num_elements();
  ThreadPool pool(2);
  auto device = make_cpu_device({});
  UpdateEngine engine(
      *device, model.layout(),
      make_offload_plan(
          {.schedule = UpdateSchedule::kInterleave, .sub_group_size = 4096, .stride = 2}, P),
      std::make_unique<AdamWRule>(hyper, pool), {model.params(), model.grads()});
  const std::vector<float> zeros(P, 0.0f);
  engine.load_state(model.params_to_host().data(), zeros.data(), zeros.data(), 0);
  for (int step = 1; step <= 3; step++) {
    model.zero_grads();
    model.forward(tokens.data(), targets.data(), B, T);
    model.backward();
    const double norm = global_grad_norm(pool, model.grads_as<float>(), P);
    const float expected = fixture.read_f32("grad_norm.step" + std::to_string(step), {})[0];
    EXPECT_NEAR(norm, expected, 1e-5 * expected) << "step " << step;
    const float scale = clip_scale(norm, max_norm);
    EXPECT_LT(scale, 1.0f) << "the fixture is built so that clipping triggers every step";
    engine.step(hyper.lr, scale);
  }
  return model.params_to_host();
}

// Finite differences of every tensor's gradient: the analytic directional derivative
// along a random unit direction against (L(p + eps d) - L(p - eps d)) / (2 eps), and the
// same at the tensor's largest-gradient element (a wrong index cannot hide in a sum).
inline void expect_central_differences(
    const ParamLayout& layout, const std::vector<float>& params, const std::vector<float>& grads,
    const std::function<double(const std::vector<float>&)>& loss_at, double eps = 1e-2) {
  Rng rng(7);
  for (const ParamView& view : layout.views()) {
    std::vector<float> direction(view.numel);
    double norm = 0.0;
    for (float& d : direction) {
      d = rng.normal();
      norm += static_cast<double>(d) * d;
    }
    double analytic = 0.0;
    for (size_t i = 0; i < view.numel; i++) {
      direction[i] = static_cast<float>(direction[i] / std::sqrt(norm));
      analytic += static_cast<double>(grads[view.offset + i]) * direction[i];
    }
    std::vector<float> plus = params, minus = params;
    for (size_t i = 0; i < view.numel; i++) {
      plus[view.offset + i] += static_cast<float>(eps * direction[i]);
      minus[view.offset + i] -= static_cast<float>(eps * direction[i]);
    }
    const double numeric = (loss_at(plus) - loss_at(minus)) / (2 * eps);
    EXPECT_NEAR(analytic, numeric, 1e-4 + 5e-3 * std::fabs(numeric)) << view.name;
    size_t top = 0;
    for (size_t i = 1; i < view.numel; i++)
      if (std::fabs(grads[view.offset + i]) > std::fabs(grads[view.offset + top])) top = i;
    plus = minus = params;
    plus[view.offset + top] += static_cast<float>(eps);
    minus[view.offset + top] -= static_cast<float>(eps);
    const double one = (loss_at(plus) - loss_at(minus)) / (2 * eps);
    EXPECT_NEAR(grads[view.offset + top], one, 1e-4 + 5e-3 * std::fabs(one))
        << view.name << "[" << top << "]";
  }
}

}  // namespace tandem::testing
