// activation_checkpointing.interval through the whole trainer: the same state digest and
// losses as keeping every layer, for both families, fp32 and bf16, under an offloaded
// schedule, at ZeRO stages 0 and 3 on 2 in-process ranks (stage 3 gathers a layer's
// parameters again for its recompute) and with DeMo; the memory plan counts what recompute
// keeps; DeepSpeed's keys of the section that mean nothing here are refused by name.

#include <gtest/gtest.h>

#include <string>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/core/format.h"
#include "tandem/core/thread_pool.h"
#include "tandem/device/device.h"
#include "tandem/model/model_family.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using testing::error_of;

class ActivationCheckpointing : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_small_corpus(data_); }

  // Four layers, so that interval 3 leaves a shorter last segment.
  json config(const std::string& run, bool llama = false) const {
    json c = testing::tiny_run_config(data_, dir_ / run);
    c["model"]["n_layer"] = 4;
    if (llama)
      c["model"] = {
          {"type", "llama"},          {"vocab_size", 256},      {"max_position_embeddings", 16},
          {"hidden_size", 16},        {"num_hidden_layers", 4}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"intermediate_size", 24}};
    c["train"]["steps"] = 6;
    c["train"]["eval_interval"] = 3;
    return c;
  }

  struct Trained {
    std::string digest;
    std::vector<float> losses;
    size_t device_bytes = 0;  // rank 0's, at the end: the activations recompute keeps
  };

  // The digest and losses of `c` at `interval` on `ranks`, all ranks agreeing.
  static Trained trained(json c, int interval, int ranks, bool on_host = false) {
    c["activation_checkpointing"] = {{"interval", interval}};
    if (on_host) c["activation_checkpointing"]["cpu_checkpointing"] = true;
    c["train"]["output_dir"] =
        cat(c["train"]["output_dir"].get<std::string>(), "_", interval, on_host ? "_host" : "");
    const testing::RankResults results = testing::train_on_ranks(ranks, c);
    testing::expect_ranks_agree(results, cat("interval ", interval));
    return {results.by_rank[0].state_digest, testing::losses(results.by_rank[0]),
            results.by_rank[0].device_bytes_in_use};
  }

  static void expect_same_bits_at_every_interval(const json& c, int ranks) {
    const Trained kept = trained(c, 0, ranks);
    ASSERT_FALSE(kept.digest.empty());
    size_t device_bytes_at_1 = 0;
    for (const auto& [interval, on_host] :
         {std::pair{1, false}, std::pair{3, false}, std::pair{1, true}}) {
      SCOPED_TRACE(cat("interval ", interval, on_host ? ", cpu_checkpointing" : ""));
      const Trained recomputed = trained(c, interval, ranks, on_host);
      EXPECT_EQ(recomputed.digest, kept.digest);
      EXPECT_EQ(recomputed.losses, kept.losses);
      EXPECT_LT(recomputed.device_bytes, kept.device_bytes) << "recompute was not in effect";
      if (interval == 1 && !on_host) device_bytes_at_1 = recomputed.device_bytes;
      if (on_host) {  // two of the four kept outputs on the device
        EXPECT_LT(recomputed.device_bytes, device_bytes_at_1) << "the outputs stayed on the device";
      }
    }
  }

  testing::ScratchDir dir_{"activation_checkpointing"};
  std::filesystem::path data_ = dir_ / "corpus.txt";
};

TEST_F(ActivationCheckpointing, GivesTheBitsOfKeepingEveryLayerForBothFamiliesAndDtypes) {
  for (bool llama : {false, true})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(cat(llama ? "llama" : "gpt2", bf16 ? " bf16" : " fp32"));
      json c = config(cat("run_", llama, bf16), llama);
      c["bf16"] = {{"enabled", bf16}};
      c["offload_optimizer"] = {{"schedule", "interleave"}, {"stride", 2}};
      c["zero_optimization"] = {{"sub_group_size", 3000}};
      expect_same_bits_at_every_interval(c, 1);
    }
}

TEST_F(ActivationCheckpointing, GivesTheBitsOfKeepingEveryLayerAtZeroStagesZeroAndThree) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE(cat("stage ", stage));
    json c = config(cat("stage", stage));
    c["zero_optimization"] = {{"stage", stage}, {"stage3_max_live_parameters", 2000}};
    expect_same_bits_at_every_interval(c, 2);
  }
}

TEST_F(ActivationCheckpointing, GivesTheBitsOfKeepingEveryLayerWithDemo) {
  json c = config("demo");
  c["optimizer"] = {{"type", "DeMo"}, {"params", {{"lr", 1e-3}, {"compression_topk", 4}}}};
  expect_same_bits_at_every_interval(c, 2);
}

TEST_F(ActivationCheckpointing, ThePlanCountsWhatRecomputeKeeps) {
  json c = config("plan");
  const std::unique_ptr<Device> device = make_cpu_device({.memory_bytes = size_t{1} << 30});
  ThreadPool pool(1);
  for (int interval : {0, 1, 2}) {
    c["activation_checkpointing"] = {{"interval", interval}};
    const TrainConfig parsed = parse_train_config(c);
    const TrainingMemoryPlan plan = plan_training(parsed, *device, pool);
    EXPECT_EQ(plan.activation_bytes,
              model_activation_bytes(parsed.model, 4, 16, StorageDType::kF32, interval));
    // `tandem plan` shows both figures when recompute is on.
    const std::string text = plan.to_text();
    const size_t without = model_activation_bytes(parsed.model, 4, 16, StorageDType::kF32, 0);
    if (interval > 0) {
      EXPECT_CONTAINS(
          text, cat("(activations ", format_bytes(plan.activation_bytes), " recomputing every ",
                    interval == 1 ? std::string("layer") : cat(interval, " layers"), ", ",
                    format_bytes(without), " without"));
    } else {
      EXPECT_CONTAINS(text, cat("(activations ", format_bytes(without), ", working params"));
    }
  }
  EXPECT_LT(model_activation_bytes(parse_train_config(c).model, 4, 16, StorageDType::kF32, 1),
            model_activation_bytes(parse_train_config(c).model, 4, 16, StorageDType::kF32, 0));
}

// `tandem plan` and the error of a config that does not fit name the largest micro-batch that
// fits, with and without recompute: a device that holds five sequences' activations holds
// five, and recomputing every layer more; the plan of each answer fits, one more does not.
TEST_F(ActivationCheckpointing, ThePlanNamesTheLargestMicroBatchThatFits) {
  json c = config("largest");
  ThreadPool pool(1);
  const TrainConfig parsed = parse_train_config(c);
  const std::unique_ptr<Device> roomy = make_cpu_device({.memory_bytes = size_t{1} << 30});
  const TrainingMemoryPlan roomy_plan = plan_training(parsed, *roomy, pool);
  const size_t rest = roomy_plan.total.device - roomy_plan.activation_bytes;
  const size_t capacity =
      rest + model_activation_bytes(parsed.model, 5, 16, StorageDType::kF32, 0) + 1;
  const std::unique_ptr<Device> device = make_cpu_device({.memory_bytes = capacity});
  auto plan_at = [&](int B, int interval) {
    json at = c;
    at["train_micro_batch_size_per_gpu"] = B;
    at["activation_checkpointing"] = {{"interval", interval}};
    return plan_training(parse_train_config(at), *device, pool);
  };
  const TrainingMemoryPlan plan = plan_at(4, 0);
  EXPECT_EQ(largest_micro_batch(plan, parsed, 0), 5);
  const int with_recompute = largest_micro_batch(plan, parsed, 1);
  EXPECT_GT(with_recompute, 5);
  EXPECT_TRUE(plan_at(5, 0).fits());
  EXPECT_FALSE(plan_at(6, 0).fits());
  EXPECT_TRUE(plan_at(with_recompute, 1).fits());
  EXPECT_FALSE(plan_at(with_recompute + 1, 1).fits());
  EXPECT_EQ(largest_micro_batch_text(plan, parsed),
            cat("largest micro-batch that fits: 5 (", with_recompute,
                " recomputing every layer: activation_checkpointing.interval=1)"));
  // A micro-batch too big is refused naming both.
  json too_big = c;
  too_big["train_micro_batch_size_per_gpu"] = 8;
  const TrainConfig big = parse_train_config(too_big);
  EXPECT_CONTAINS(testing::error_of([&] { check_fits(plan_at(8, 0), big); }),
                  cat("largest micro-batch that fits: 5 (", with_recompute,
                      " recomputing every layer: activation_checkpointing.interval=1)"));
}

TEST_F(ActivationCheckpointing, DeepSpeedsKeysThatMeanNothingHereAreRefusedByName) {
  json c = config("keys");
  c["activation_checkpointing"] = {{"interval", -1}};
  EXPECT_CONTAINS(error_of([&] { parse_train_config(c); }),
                  "activation_checkpointing.interval must be a non-negative integer");
  for (const char* key :
       {"partition_activations", "number_checkpoints", "contiguous_memory_optimization",
        "synchronize_checkpoint_boundary", "profile"}) {
    c["activation_checkpointing"] = {{"interval", 1}, {key, true}};
    EXPECT_CONTAINS(error_of([&] { parse_train_config(c); }),
                    cat("activation_checkpointing.", key, ": "));
  }
  c["activation_checkpointing"] = {{"intervall", 1}};
  const std::string typo = error_of([&] { parse_train_config(c); });
  EXPECT_CONTAINS(typo, "did you mean 'interval'?");
  // The keys refused by name are not offered.
  EXPECT_CONTAINS(typo, "allowed keys: interval, cpu_checkpointing");
  EXPECT_EQ(typo.find("partition_activations"), std::string::npos) << typo;
  c["activation_checkpointing"] = {{"interval", 2}};
  EXPECT_EQ(to_json(parse_train_config(c))["activation_checkpointing"],
            json({{"interval", 2}, {"cpu_checkpointing", false}}));
  c["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  EXPECT_CONTAINS(error_of([&] { parse_train_config(c); }),
                  "activation_checkpointing.interval is 0 (nothing is recomputed)");
}

// cpu_checkpointing's outputs are planned in pinned host memory, and leave the device two.
TEST_F(ActivationCheckpointing, ThePlanPutsTheKeptOutputsOfCpuCheckpointingInPinnedMemory) {
  json c = config("plan_host");
  const std::unique_ptr<Device> device = make_cpu_device({.memory_bytes = size_t{1} << 30});
  ThreadPool pool(1);
  c["activation_checkpointing"] = {{"interval", 1}};
  const TrainingMemoryPlan on_device = plan_training(parse_train_config(c), *device, pool);
  c["activation_checkpointing"]["cpu_checkpointing"] = true;
  const TrainingMemoryPlan on_host = plan_training(parse_train_config(c), *device, pool);
  const size_t row = 4 * 16 * 16 * sizeof(float);  // B x T x C
  EXPECT_EQ(on_host.activation_host_bytes, 4 * row);
  EXPECT_EQ(on_device.activation_bytes - on_host.activation_bytes, 2 * row);
  EXPECT_EQ(on_host.total.pinned_host - on_device.total.pinned_host, 4 * row);
  EXPECT_CONTAINS(on_host.to_text(),
                  cat("the kept layer outputs (cpu_checkpointing), ", format_bytes(4 * row)));
}

}  // namespace
}  // namespace tandem
