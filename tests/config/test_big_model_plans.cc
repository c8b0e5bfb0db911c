// The big-model configs (configs/gpt2-1.5b.json, llama2-{7b,13b,20b}.json) planned before
// they are run, as `tandem plan --set device.memory_gb=80` plans them on a machine without
// a GPU: parameter counts against the published shapes, the bytes of every tier against
// the formulas (bf16 working params and gradients 2 + 2 bytes per parameter on the device,
// fp32 params, m, v 12 bytes plus bf16 gradient and working copy 4 in pinned host memory
// for CPU-updated parameters, activations counted tensor by tensor), which fits one 80 GB
// GPU, and the `auto` schedule's answer.
#include <gtest/gtest.h>

#include <string>

#include "support/test_util.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/model/model_family.h"

namespace tandem {
namespace {

// The GPU machine's CPU, assumed too, so that the plans do not depend on this machine (and
// the tests do not spend seconds timing it): 4 G params/s, a two-socket server's AdamW.
AssumedGpu h100() {
  AssumedGpu gpu;
  gpu.cpu_params_per_s = 4e9;
  return gpu;
}

TrainConfig big(const std::string& name, std::vector<std::string> overrides = {}) {
  overrides.push_back("device.memory_gb=80");
  return load_train_config(testing::source_dir() / "configs" / (name + ".json"), overrides);
}

// Activation bytes of a Llama written out independently of model/llama.cc: per layer the
// stored tensors (bf16) and statistics (fp32), then the head and backward scratch.
size_t llama_activations(const ModelConfig& m, size_t B, size_t T) {
  const size_t BT = B * T, C = m.n_embd, I = m.mlp_width(), V = m.vocab_size;
  const size_t W = (m.n_head + 2 * m.kv_heads()) * m.head_size();
  const size_t bf16_per_layer =
      BT * (7 * C + W + 3 * I);  // ln1 qkv atty attproj res2 ln2 gateup swiglu down res3
  const size_t fp32_per_layer = BT * (2 + m.n_head);     // two rstd, lse per head
  const size_t bf16_once = BT * (2 * C)                  // embedding output, final norm
                           + BT * (2 * C + W + 3 * I)    // backward scratch
                           + 2 * BT * V;                 // logits and their gradient
  const size_t fp32_once = BT + T * m.head_size() + BT;  // final rstd, rotary table, losses
  return 2 * (m.n_layer * bf16_per_layer + bf16_once) +
         4 * (m.n_layer * fp32_per_layer + fp32_once) + 2 * BT * sizeof(int32_t);
}

TEST(BigModelPlans, ParameterCountsAreThePublishedShapes) {
  EXPECT_EQ(big("gpt2-1.5b").model.num_parameters(), 1'557'686'400);    // vocab padded to 50304
  EXPECT_EQ(big("llama2-7b").model.num_parameters(), 6'738'415'616);    // Llama-2-7b-hf
  EXPECT_EQ(big("llama2-13b").model.num_parameters(), 13'015'864'320);  // Llama-2-13b-hf
  EXPECT_EQ(big("llama2-20b").model.num_parameters(), 20'325'095'424);
  for (const char* name : {"gpt2-1.5b", "llama2-7b", "llama2-13b", "llama2-20b"}) {
    const TrainConfig c = big(name);
    EXPECT_EQ(model_layout(c.model).num_elements(), static_cast<size_t>(c.model.num_parameters()))
        << name;
  }
}

// The fine-tuning configs of the Llama family's types: the counts transformers 5.24 gives
// for the published config.json of each (AutoModelForCausalLM.from_config on the meta
// device, summing every parameter's numel).
TEST(BigModelPlans, TheFineTuneConfigsHaveThePublishedParameterCounts) {
  EXPECT_EQ(big("llama3.1-8b").model.num_parameters(), 8'030'261'248);
  EXPECT_EQ(big("llama3.2-1b").model.num_parameters(), 1'235'814'400);  // tied head
  EXPECT_EQ(big("qwen2.5-7b").model.num_parameters(), 7'615'616'512);   // q, k, v biases
  EXPECT_EQ(big("qwen3-8b").model.num_parameters(), 8'190'735'360);     // q/k norms
  for (const char* name : {"llama3.1-8b", "llama3.2-1b", "qwen2.5-7b", "qwen3-8b"}) {
    const TrainConfig c = big(name);
    EXPECT_EQ(model_layout(c.model).num_elements(), static_cast<size_t>(c.model.num_parameters()))
        << name;
  }
  EXPECT_EQ(big("llama3.1-8b").model.rope_scaling.type, RopeType::kLlama3);
  EXPECT_EQ(big("qwen2.5-7b").model.type, ModelType::kQwen2);
  EXPECT_EQ(big("qwen3-8b").model.type, ModelType::kQwen3);
}

TEST(BigModelPlans, EveryTierIsItsFormulaWithTheStateOnTheCpu) {
  ThreadPool pool(1);
  for (const char* name : {"llama2-7b", "llama2-13b"}) {
    SCOPED_TRACE(name);
    const TrainConfig c = big(name, {"offload_optimizer.schedule=cpu"});
    const size_t P = static_cast<size_t>(c.model.num_parameters());
    const TrainingMemoryPlan plan = plan_training_without_gpu(c, pool, {0, P}, 1, h100());
    EXPECT_EQ(plan.activation_bytes, llama_activations(c.model, 1, 2048));
    EXPECT_EQ(plan.total.device, plan.activation_bytes + 4 * P);
    EXPECT_EQ(plan.total.pinned_host, 16 * P + plan.snapshot.pool_bytes());
    EXPECT_TRUE(plan.snapshot.streamed) << "a full copy of 12P is far beyond the default pool";
    EXPECT_LE(plan.snapshot.pool_bytes(), CheckpointSnapshotPlan::kDefaultPoolBytes);
    EXPECT_GT(plan.snapshot.pool_bytes(), CheckpointSnapshotPlan::kDefaultPoolBytes - 4 * 12);
    EXPECT_TRUE(plan.fits()) << plan.to_text();
    ASSERT_TRUE(plan.gpu_assumed.has_value());
    EXPECT_GT(plan.prediction.host_seconds, 0.0);
    EXPECT_NE(plan.to_text().find("assumed (no GPU here): H100"), std::string::npos);
    // The host-only device's rates beside this CPU say nothing of a GPU's DMA.
    EXPECT_FALSE(plan.rates.shared.measured());
    EXPECT_FALSE(plan.rates.shared_h2d.measured());
    // Every update on the CPU, then the last subgroup's bf16 working copy to the device.
    const double tail = plan.offload.subgroups.back().size() * 2.0 / plan.rates.h2d_bytes_per_s;
    EXPECT_NEAR(plan.prediction.host_seconds, P / 4e9 + tail, 1e-6 * P / 4e9);
  }
}

TEST(BigModelPlans, TwentyBillionNeedsFourGpusAtStageThree) {
  ThreadPool pool(1);
  const TrainConfig one = big("llama2-20b", {"offload_optimizer.schedule=cpu"});
  const size_t P = static_cast<size_t>(one.model.num_parameters());
  const TrainingMemoryPlan alone = plan_training_without_gpu(one, pool, {0, P}, 1, h100());
  EXPECT_FALSE(alone.fits()) << "bf16 params + gradients alone take 4P = 81 GB";
  EXPECT_GE(alone.total.device, 4 * P);
  // The paper's setting: 4 ranks, ZeRO stage 3.
  const TrainConfig four =
      big("llama2-20b", {"offload_optimizer.schedule=cpu", "zero_optimization.stage=3"});
  const TrainingMemoryPlan rank0 =
      plan_training_without_gpu(four, pool, zero_state_range(four, 4, 0), 4, h100());
  EXPECT_TRUE(rank0.fits()) << rank0.to_text();
  EXPECT_LT(rank0.model_state_bytes(), 16 * P / 4 + 16 * (size_t{1} << 20));
}

// What `tandem plan` and training say when one GPU is too small: the fewest ranks at ZeRO
// stage 3, which for 20B on 80 GB GPUs is the paper's four (three leave rank 0 short).
TEST(BigModelPlans, TheFewestRanksAtStageThreeAreFoundForTwentyBillion) {
  const TrainConfig c = big("llama2-20b", {"offload_optimizer.schedule=cpu"});
  const size_t capacity = size_t{80} << 30;
  EXPECT_EQ(fewest_ranks_at_zero_stage_3(c, DeviceKind::kCuda, capacity), 4);
  ThreadPool pool(1);
  const TrainConfig three =
      big("llama2-20b", {"offload_optimizer.schedule=cpu", "zero_optimization.stage=3"});
  EXPECT_FALSE(
      plan_training_without_gpu(three, pool, zero_state_range(three, 3, 0), 3, h100()).fits());
  // Smaller GPUs need more ranks; none is enough when one rank's activations do not fit.
  EXPECT_GT(fewest_ranks_at_zero_stage_3(c, DeviceKind::kCuda, size_t{40} << 30), 4);
  EXPECT_EQ(fewest_ranks_at_zero_stage_3(c, DeviceKind::kCuda, size_t{1} << 30, 64), 0);
  // DeMo does not shard its state: no count is offered.
  TrainConfig demo = c;
  demo.optimizer.type = OptimizerType::kDeMo;
  EXPECT_EQ(fewest_ranks_at_zero_stage_3(demo, DeviceKind::kCuda, capacity), 0);
}

TEST(BigModelPlans, AutoKeepsWhatFitsOnTheGpuAndPredictsTheUpdate) {
  ThreadPool pool(1);
  const TrainConfig c = big("llama2-13b");
  const size_t P = static_cast<size_t>(c.model.num_parameters());
  const TrainingMemoryPlan plan = plan_training_without_gpu(c, pool, {0, P}, 1, h100());
  EXPECT_TRUE(plan.fits()) << plan.to_text();
  EXPECT_LE(plan.total.device, plan.device_capacity);
  EXPECT_GT(plan.prediction.seconds, 0.0);
  // Not all of 13B's 156 GB of fp32 state fits beside 4P on an 80 GB GPU; with a CPU 20x
  // slower than the GPU's update, `auto` stages what does not stay resident.
  EXPECT_GT(plan.offload.count(UpdateSite::kHost) + plan.offload.count(UpdateSite::kDeviceStaged),
            0u);
  EXPECT_GT(plan.total.pinned_host, 12 * P / 2);
}

TEST(BigModelPlans, GptTwoXlFitsOneGpu) {
  ThreadPool pool(1);
  const TrainConfig c = big("gpt2-1.5b", {"offload_optimizer.schedule=cpu"});
  const size_t P = static_cast<size_t>(c.model.num_parameters());
  const TrainingMemoryPlan plan = plan_training_without_gpu(c, pool, {0, P}, 1, h100());
  EXPECT_EQ(plan.total.device, plan.activation_bytes + 4 * P);
  EXPECT_EQ(plan.total.pinned_host, 16 * P + plan.snapshot.pool_bytes());
  EXPECT_TRUE(plan.fits()) << plan.to_text();
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// The command the issue names, end to end, on this machine (no GPU in CI): it answers.
TEST(BigModelPlans, TandemPlanAnswersForThirteenBillionOnOneEightyGigabyteGpu) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU: plan measures it instead";
  const testing::CommandResult r =
      testing::run_command(testing::tandem_binary().string() + " plan --config " +
                           (testing::source_dir() / "configs" / "llama2-13b.json").string() +
                           " --set device.memory_gb=80");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("on a cuda device of 80 GiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("parameters: 13015864320"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("predicted update time"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("<< does not fit"), std::string::npos) << r.output;
}

// 20B does not fit one 80 GB GPU: the command fails, saying by how much and on how many
// GPUs at ZeRO stage 3 it would, and that plan, run as the message says, fits.
TEST(BigModelPlans, TandemPlanNamesTheGpusTwentyBillionNeeds) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU: plan measures it instead";
  const std::string plan = testing::tandem_binary().string() + " plan --config " +
                           (testing::source_dir() / "configs" / "llama2-20b.json").string() +
                           " --set device.memory_gb=80";
  const testing::CommandResult alone = testing::run_command(plan);
  EXPECT_NE(alone.exit_code, 0) << alone.output;
  EXPECT_NE(alone.output.find("<< does not fit"), std::string::npos) << alone.output;
  EXPECT_NE(alone.output.find("shard the model over 4 ranks at ZeRO stage 3"), std::string::npos)
      << alone.output;
  // The command the message suggests, pasted as it is (tandem on the PATH: here, the build's).
  const std::string marker = "rank 0 fits: `tandem ";
  const size_t begin = alone.output.find(marker);
  ASSERT_NE(begin, std::string::npos) << alone.output;
  const size_t end = alone.output.find('`', begin + marker.size());
  ASSERT_NE(end, std::string::npos) << alone.output;
  const std::string suggested =
      alone.output.substr(begin + marker.size(), end - begin - marker.size());
  EXPECT_NE(suggested.find("--set device.memory_gb=80"), std::string::npos) << suggested;
  const testing::CommandResult four =
      testing::run_command(testing::tandem_binary().string() + " " + suggested);
  ASSERT_EQ(four.exit_code, 0) << suggested << "\n" << four.output;
  EXPECT_EQ(four.output.find("<< does not fit"), std::string::npos) << four.output;
  EXPECT_NE(four.output.find("rank 0 of 4"), std::string::npos) << four.output;
}

}  // namespace
}  // namespace tandem
