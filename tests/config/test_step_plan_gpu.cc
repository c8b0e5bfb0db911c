// The step planner on the cuda device: the compute calibration times the model's passes on
// the GPU, the plan ranks the candidates from those times, and an "auto" run trains with its
// choice. Skipped, saying why, without a GPU; CI runs it on the emulated GPU
// (test_step_plan_gpu_emulated), so the path a GPU machine takes first has run before one is
// at hand.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/config/compute_calibration.h"
#include "tandem/config/step_plan.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/train/step_settings.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

nlohmann::json gpu_auto_config(const testing::ScratchDir& dir) {
  nlohmann::json json = testing::tiny_run_config(dir / "data.txt", dir / "run");
  json["model"]["n_embd"] = 32;
  json["model"]["n_layer"] = 2;
  json["device"] = {{"type", "cuda"}, {"memory_gb", 1}};
  json["bf16"] = {{"enabled", true}};
  json["train_batch_size"] = 4;
  json["train_micro_batch_size_per_gpu"] = "auto";
  json["gradient_accumulation_steps"] = "auto";
  json["train"]["steps"] = 2;
  json["train"]["eval_interval"] = 0;
  return json;
}

TEST(StepPlanGpu, CalibratesOnTheCudaDeviceAndTrainsWithTheChoice) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no GPU to run on: " << why;
  testing::ScratchDir dir("step_plan_gpu");
  testing::write_small_corpus(dir / "data.txt");
  const TrainConfig config = parse_train_config(gpu_auto_config(dir));
  {
    const std::unique_ptr<Device> device = make_training_device(config);
    ASSERT_EQ(device->kind(), DeviceKind::kCuda);
    const ComputeRates rates = calibrate_compute_rates(config, *device, {1, 2}, 1);
    ASSERT_EQ(rates.samples.size(), 2u);
    for (const ComputeRates::Sample& s : rates.samples) {
      EXPECT_GT(s.forward.layer, 0) << "B=" << s.micro_batch;
      EXPECT_GT(s.backward.layer, 0) << "B=" << s.micro_batch;
      EXPECT_GE(s.forward.rest, 0) << "B=" << s.micro_batch;
    }
    EXPECT_CONTAINS(rates.source, "measured on the cuda:0");
    ThreadPool pool(1);
    const StepPlan plan = plan_step(config, *device, pool);
    ASSERT_FALSE(plan.ranked.empty()) << plan.to_text();
    EXPECT_EQ(plan.sequences_per_rank, 4);
    EXPECT_CONTAINS(plan.to_text(), "measured on the cuda:0");
  }
  // The run plans again (on its own device), trains with the choice and records it.
  const TrainResult run = train(config, testing::quiet());
  EXPECT_EQ(run.steps_done, 2);
  const TrainConfig recorded = read_training_state(run.last_checkpoint).config;
  EXPECT_FALSE(recorded.has_auto_step_settings());
  EXPECT_EQ(recorded.micro_batch_size * recorded.gradient_accumulation_steps, 4);
}

}  // namespace
}  // namespace tandem
