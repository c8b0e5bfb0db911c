// AdamW reference, gradient clipping and the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/adamw/adamw_reference.h"
#include "tandem/optim/grad_clip.h"
#include "tandem/optim/lr_schedule.h"

namespace tandem {
namespace {

// AdamW written the textbook way, in double: the reference must agree to fp32 accuracy.
TEST(AdamWReference, MatchesTheTextbookFormulaInDouble) {
  const AdamWHyper hyper{
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  Rng rng(3);
  const size_t n = 1000;
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; i++) p[i] = rng.normal();
  std::vector<double> pd(p.begin(), p.end()), md(n, 0.0), vd(n, 0.0);
  const float grad_scale = 0.5f;
  for (int step = 1; step <= 5; step++) {
    for (auto& x : g) x = rng.normal();
    adamw_reference(p.data(), g.data(), m.data(), v.data(), n,
                    adamw_step_scalars(hyper, step, true, grad_scale));
    for (size_t i = 0; i < n; i++) {
      const double gi = static_cast<double>(g[i]) * grad_scale;
      md[i] = hyper.beta1 * md[i] + (1 - static_cast<double>(hyper.beta1)) * gi;
      vd[i] = hyper.beta2 * vd[i] + (1 - static_cast<double>(hyper.beta2)) * gi * gi;
      const double mhat = md[i] / (1 - std::pow(static_cast<double>(hyper.beta1), step));
      const double vhat = vd[i] / (1 - std::pow(static_cast<double>(hyper.beta2), step));
      pd[i] *= 1 - static_cast<double>(hyper.lr) * hyper.weight_decay;
      pd[i] -= hyper.lr * mhat / (std::sqrt(vhat) + hyper.eps);
    }
  }
  for (size_t i = 0; i < n; i++) {
    ASSERT_NEAR(p[i], pd[i], 1e-5 * (1 + std::fabs(pd[i]))) << i;
    ASSERT_NEAR(m[i], md[i], 1e-5 * (1 + std::fabs(md[i]))) << i;
    ASSERT_NEAR(v[i], vd[i], 1e-5 * (1 + std::fabs(vd[i]))) << i;
  }
}

TEST(AdamWReference, NoDecayLeavesZeroGradientParamsAlone) {
  const AdamWHyper hyper{.lr = 1e-2f, .weight_decay = 0.1f};
  std::vector<float> p = {1.5f, -2.0f}, g = {0.0f, 0.0f}, m = {0.0f, 0.0f}, v = {0.0f, 0.0f};
  adamw_reference(p.data(), g.data(), m.data(), v.data(), 2,
                  adamw_step_scalars(hyper, 1, false, 1.0f));
  EXPECT_EQ(p[0], 1.5f);
  EXPECT_EQ(p[1], -2.0f);
  adamw_reference(p.data(), g.data(), m.data(), v.data(), 2,
                  adamw_step_scalars(hyper, 2, true, 1.0f));
  EXPECT_FLOAT_EQ(p[0], 1.5f * (1 - 1e-3f));
}

TEST(GradClip, NormIsExactAndIndependentOfThreads) {
  std::vector<float> g(100003);
  Rng rng(5);
  double expected = 0.0;
  for (auto& x : g) {
    x = rng.normal();
    expected += static_cast<double>(x) * x;
  }
  expected = std::sqrt(expected);
  ThreadPool one_thread(1, false), three_threads(3, false);
  const double one = global_grad_norm(one_thread, g.data(), g.size());
  const double three = global_grad_norm(three_threads, g.data(), g.size());
  EXPECT_EQ(one, three);
  EXPECT_NEAR(one, expected, 1e-9 * expected);
}

TEST(GradClip, ScaleFollowsTorchClipGradNorm) {
  EXPECT_EQ(clip_scale(0.5, 1.0f), 1.0f);
  EXPECT_EQ(clip_scale(1.0, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(clip_scale(4.0, 1.0f), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_scale(1e9, 0.0f), 1.0f);  // disabled
}

TEST(LrSchedule, WarmupThenCosineToTheFloor) {
  const WarmupCosineSchedule s{
      .base_lr = 1e-3, .warmup_steps = 10, .total_steps = 110, .min_ratio = 0.1};
  // In double from the values as written (DeMo's decay factor is rounded from these).
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.55e-3);  // halfway down the cosine
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);
  for (int64_t step = 10; step < 110; step++) EXPECT_LE(s.lr_at(step + 1), s.lr_at(step));
}

}  // namespace
}  // namespace tandem
