// The step planner's arithmetic on synthetic rates (config/step_plan.h): "auto" read and
// written, the splits of train_batch_size, the interpolation of the compute rates, the
// predicted step written out again here from its definition, and the ranking; then the plans
// of a 7B model on an assumed H100 at the sweep's tokens per step.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/test_util.h"
#include "tandem/config/compute_calibration.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/step_plan.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/model/model_family.h"
#include "tandem/optim/optimizer_family.h"
#include "tandem/zero/partition.h"

namespace tandem {
namespace {

using json = nlohmann::json;

json small_config() {
  return json::parse(R"({
    "model": {"vocab_size": 256, "context_length": 64, "n_layer": 6, "n_head": 2, "n_embd": 32},
    "data": {"train_path": "unused.txt"},
    "train": {"seq_len": 64}
  })");
}

TrainConfig parsed(json j) { return parse_train_config(j); }

// The error `fn` throws names every one of `parts`.
template <typename Fn>
void expect_error_naming(Fn&& fn, const std::vector<std::string>& parts) {
  const std::string error = testing::error_of(fn);
  for (const std::string& part : parts) EXPECT_CONTAINS(error, part);
}

TEST(StepPlanConfig, AutoIsReadAndWrittenBack) {
  json j = small_config();
  j["train_batch_size"] = 24;
  j["train_micro_batch_size_per_gpu"] = "auto";
  j["gradient_accumulation_steps"] = "Auto";
  j["activation_checkpointing"] = {{"interval", "auto"}};
  const TrainConfig c = parsed(j);
  EXPECT_EQ(c.micro_batch_size, kAuto);
  EXPECT_EQ(c.gradient_accumulation_steps, kAuto);
  EXPECT_EQ(c.activation_checkpointing.interval, kAuto);
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_TRUE(c.has_auto_step_settings());
  const json written = to_json(c);
  EXPECT_EQ(written["train_micro_batch_size_per_gpu"], "auto");
  EXPECT_EQ(written["gradient_accumulation_steps"], "auto");
  EXPECT_EQ(written["activation_checkpointing"]["interval"], "auto");
  EXPECT_EQ(to_json(parse_train_config(written)), written);
  EXPECT_FALSE(parsed(small_config()).has_auto_step_settings());
}

TEST(StepPlanConfig, AutoNeedsABatchToSplitAndNamesWhatIsWrong) {
  json j = small_config();
  j["train_micro_batch_size_per_gpu"] = "auto";
  expect_error_naming([&] { parsed(j); }, {"train_micro_batch_size_per_gpu", "train_batch_size"});
  j = small_config();
  j["train_micro_batch_size_per_gpu"] = "automatic";
  expect_error_naming([&] { parsed(j); }, {"train_micro_batch_size_per_gpu", "\"auto\""});
  j = small_config();
  j["activation_checkpointing"] = {{"interval", "auto"}, {"cpu_checkpointing", true}};
  expect_error_naming([&] { parsed(j); }, {"cpu_checkpointing", "\"auto\""});
  j = small_config();
  j["train_batch_size"] = -4;
  expect_error_naming([&] { parsed(j); }, {"train_batch_size"});
}

// train_batch_tokens is train_batch_size in tokens: whole sequences of train.seq_len (64 here),
// refused with the nearest whole batches otherwise, and refused when both keys disagree.
TEST(StepPlanConfig, TrainBatchTokensIsWholeSequencesOfTheRun) {
  json j = small_config();
  j["train_batch_tokens"] = 24 * 64;
  j["train_micro_batch_size_per_gpu"] = "auto";
  const TrainConfig c = parsed(j);
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_EQ(to_json(parse_train_config(to_json(c))), to_json(c));
  j["train_batch_size"] = 24;  // the same batch said twice
  EXPECT_EQ(parsed(j).train_batch_size, 24);
  j["train_batch_size"] = 12;
  expect_error_naming([&] { parsed(j); },
                      {"train_batch_tokens 1536", "24 sequences", "train_batch_size is 12"});
  j.erase("train_batch_size");
  j["train_batch_tokens"] = 1000;
  expect_error_naming([&] { parsed(j); }, {"train_batch_tokens 1000", "train.seq_len",
                                           "960 (15 sequences)", "1024 (16 sequences)"});
  j["train_batch_tokens"] = 10;
  expect_error_naming([&] { parsed(j); }, {"train_batch_tokens 10", "64 (1 sequence)"});
  j["train_batch_tokens"] = 128;
  j["train"]["seq_len"] = 32;  // the run's sequence length, not the model's context
  EXPECT_EQ(parsed(j).train_batch_size, 4);
}

TrainConfig auto_config(int64_t train_batch_size) {
  json j = small_config();
  j["train_batch_size"] = train_batch_size;
  j["train_micro_batch_size_per_gpu"] = "auto";
  j["gradient_accumulation_steps"] = "auto";
  j["activation_checkpointing"] = {{"interval", "auto"}};
  return parsed(j);
}

TEST(StepCandidates, EverySplitOfTheRanksShareWithEachRecompute) {
  const TrainConfig c = auto_config(24);
  const std::vector<StepSettings> candidates = step_candidates(c, 2);  // 12 per rank
  std::set<std::pair<int, int>> splits;
  for (const StepSettings& s : candidates) {
    EXPECT_EQ(s.micro_batch * s.accumulation, 12);
    splits.insert({s.micro_batch, s.accumulation});
  }
  EXPECT_EQ(splits,
            (std::set<std::pair<int, int>>{{1, 12}, {2, 6}, {3, 4}, {4, 3}, {6, 2}, {12, 1}}));
  EXPECT_EQ(candidates.size(), 3 * splits.size());  // none, on the device, kept on the host
  // The recompute interval of each is the one whose activations take the least memory.
  for (const StepSettings& s : candidates) {
    if (s.recompute_interval == 0) continue;
    for (int k = 1; k <= c.model.n_layer; k++)
      EXPECT_LE(model_activation_bytes(c.model, s.micro_batch, 64, c.storage_dtype(),
                                       s.recompute_interval, s.cpu_checkpointing),
                model_activation_bytes(c.model, s.micro_batch, 64, c.storage_dtype(), k,
                                       s.cpu_checkpointing));
  }
}

TEST(StepCandidates, AFixedSideDividesAndABadProductIsNamed) {
  TrainConfig c = auto_config(24);
  c.micro_batch_size = 4;
  c.activation_checkpointing.interval = 2;
  std::vector<StepSettings> candidates = step_candidates(c, 1);
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0], (StepSettings{4, 6, 2, false}));
  c.micro_batch_size = 5;
  expect_error_naming([&] { step_candidates(c, 1); },
                      {"train_batch_size 24", "train_micro_batch_size_per_gpu"});
  c = auto_config(24);
  expect_error_naming([&] { step_candidates(c, 5); }, {"not a multiple", "5 ranks"});
  c.micro_batch_size = 4;
  c.gradient_accumulation_steps = 2;
  expect_error_naming([&] { step_candidates(c, 1); }, {"4 x 2 x 1 = 8"});
  const TrainConfig chosen = with_step_settings(auto_config(24), {3, 4, 2, true}, 2);
  EXPECT_EQ(chosen.micro_batch_size, 3);
  EXPECT_EQ(chosen.gradient_accumulation_steps, 4);
  EXPECT_EQ(chosen.activation_checkpointing.interval, 2);
  EXPECT_TRUE(chosen.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(chosen.train_batch_size, 24);
  EXPECT_FALSE(chosen.has_auto_step_settings());
}

TEST(ComputeRatesTest, InterpolatesBetweenSamplesAndScalesPerSequenceBeyond) {
  ComputeRates rates;
  rates.samples = {{.micro_batch = 2, .forward = {1.0, 0.5}, .backward = {2.0, 1.0}},
                   {.micro_batch = 8, .forward = {2.5, 2.0}, .backward = {5.0, 4.0}}};
  EXPECT_DOUBLE_EQ(rates.forward(2).layer, 1.0);
  EXPECT_DOUBLE_EQ(rates.forward(4).layer, 1.0 + (2.5 - 1.0) * 2 / 6);
  EXPECT_DOUBLE_EQ(rates.backward(4).rest, 1.0 + (4.0 - 1.0) * 2 / 6);
  EXPECT_DOUBLE_EQ(rates.forward(1).layer, 0.5);  // the first sample's time per sequence
  EXPECT_DOUBLE_EQ(rates.forward(16).rest, 4.0);  // the last's
  EXPECT_DOUBLE_EQ(rates.backward(16).layer, 10.0);
  EXPECT_DOUBLE_EQ(PassSeconds({0.25, 1.0}).of(4), 2.0);
}

TEST(ComputeRatesTest, CalibrationBatchesAreFewAndWithinTheTokenCap) {
  // Up to 5, halving down from the largest within 8192 tokens, the smallest always.
  EXPECT_EQ(calibration_batches({1, 2, 4, 8, 16, 32, 64, 128, 256}, 128, 8192),
            (std::vector<int>{1, 8, 16, 32, 64}));
  EXPECT_EQ(calibration_batches({12, 1, 2, 3, 4, 6}, 128, 8192), (std::vector<int>{1, 3, 6, 12}));
  EXPECT_EQ(calibration_batches({64, 128}, 2048, 8192), (std::vector<int>{64}));
  EXPECT_EQ(calibration_batches({2}, 2048, 8192), (std::vector<int>{2}));
}

TEST(ComputeRatesTest, AssumedRatesAreTheModelFlops) {
  const TrainConfig c = parsed(small_config());
  const ComputeRates rates = assumed_compute_rates(c.model, 64, {4, 1}, 1e12, "X");
  ASSERT_EQ(rates.samples.size(), 2u);
  EXPECT_EQ(rates.samples[0].micro_batch, 1);
  const double flops = forward_flops_per_token(c.model, 64);
  // C = 32, qkv 3C, o C, MLP 2 x 4C (GPT-2): 2 x 12 C^2 + attention 4 T C per layer, head 2 C V.
  EXPECT_DOUBLE_EQ(flops, 6 * (2.0 * 12 * 32 * 32 + 4.0 * 64 * 32) + 2.0 * 32 * 256);
  EXPECT_NEAR(rates.forward(4).of(6), 4 * 64 * flops / 1e12, 1e-15);
  EXPECT_NEAR(rates.backward(4).of(6), 2 * rates.forward(4).of(6), 1e-15);
}

// A memory plan with the parts predict_step reads, made by hand.
TrainingMemoryPlan hand_plan(size_t host_params, double update_seconds, bool overlap) {
  TrainingMemoryPlan plan;
  plan.model_elem_bytes = 2;
  plan.offload.settings.overlap_forward = overlap;
  plan.offload.num_params = 1000;
  plan.offload.partition = {0, 1000};
  plan.offload.subgroups = {{0, 1000 - host_params, UpdateSite::kDeviceResident},
                            {1000 - host_params, 1000, UpdateSite::kHost}};
  plan.offload.max_subgroup_size = 1000;
  plan.rates.d2h_bytes_per_s = 1000;  // 2000 bytes of host gradients take 2 s
  plan.rates.h2d_bytes_per_s = 500;
  plan.prediction.seconds = update_seconds;
  plan.prediction.host_seconds = update_seconds;
  return plan;
}

TEST(PredictStep, IsTheSumOfItsParts) {
  TrainConfig c = parsed(small_config());  // 6 layers
  c.micro_batch_size = 4;
  c.gradient_accumulation_steps = 3;
  ComputeRates rates;
  rates.samples = {{.micro_batch = 4, .forward = {0.1, 0.2}, .backward = {0.2, 0.4}}};
  // No recompute; all 1000 parameters' gradients (2 bytes) go to the host: 2 s beside a
  // backward of 1.6 s, 0.4 s exposed; the update is not overlapped.
  StepPrediction p = predict_step(c, hand_plan(1000, 0.7, false), rates);
  EXPECT_DOUBLE_EQ(p.forward, 3 * (6 * 0.1 + 0.2));
  EXPECT_DOUBLE_EQ(p.backward, 3 * (6 * 0.2 + 0.4));
  EXPECT_DOUBLE_EQ(p.recompute, 0);
  EXPECT_NEAR(p.copies, 2.0 - 1.6, 1e-12);
  EXPECT_DOUBLE_EQ(p.exposed_update, 0.7);
  EXPECT_NEAR(p.seconds(), 2.4 + 4.8 + 0.4 + 0.7, 1e-12);
  // Recompute every 2 layers: each micro-batch runs every layer's forward again, which the
  // gradients' copy hides behind too.
  c.activation_checkpointing.interval = 2;
  p = predict_step(c, hand_plan(1000, 0.7, false), rates);
  EXPECT_NEAR(p.recompute, 3 * 6 * 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(p.copies, 0);
  // The next forward hides part of an overlapped update (it reads the resident half while
  // the host's is updated); none is hidden without overlap.
  const TrainingMemoryPlan overlapped = hand_plan(500, 0.7, true);
  p = predict_step(c, overlapped, rates);
  const double hidden =
      predict_hidden_update(overlapped.offload, overlapped.prediction, 6 * 0.1 + 0.2);
  EXPECT_NEAR(hidden, 0.7 + 0.8 - (0.7 + 0.8 * 0.5), 1e-12);
  EXPECT_NEAR(p.exposed_update, 0.7 - hidden, 1e-12);
  // cpu_checkpointing: 3 kept outputs of 4 x 64 x 32 bf16 (49152 bytes) out at 1000 B/s and
  // back at 500 B/s, beyond the forward and the backward + recompute they run beside.
  c.activation_checkpointing.cpu_checkpointing = true;
  c.bf16 = true;
  p = predict_step(c, hand_plan(0, 0, false), rates);
  const double kept = 3.0 * 4 * 64 * 32 * 2;
  EXPECT_NEAR(p.copies, 3 * ((kept / 1000 - 0.8) + (kept / 500 - 2.2)), 1e-9);
}

// With several ranks, the step adds the ZeRO stage's traffic at the ranks' rate, less what the
// compute beside it hides when overlap_comm runs the collectives on their own thread.
TEST(PredictStep, CommunicationIsTheStagesTrafficLessWhatTheComputeBesideItHides) {
  TrainConfig c = parsed(small_config());
  c.micro_batch_size = 4;
  c.gradient_accumulation_steps = 3;
  ComputeRates rates;  // forward 0.8 s and backward 1.6 s per micro-batch
  rates.samples = {{.micro_batch = 4, .forward = {0.1, 0.2}, .backward = {0.2, 0.4}}};
  TrainingMemoryPlan memory = hand_plan(0, 0, false);
  memory.world_size = 4;
  const double P = static_cast<double>(c.model.num_parameters());
  const double ring = 0.75 * P * 4;  // (N - 1) / N of the fp32 model
  const CommRate one_ring_a_second{ring, "test"};
  const double gather_after_update =
      3.0 * static_cast<double>(ZeroPartition(c.model.num_parameters(), 4).partition_size()) * 4 /
      ring;
  const auto predicted = [&](int stage, bool overlap) {
    c.zero.stage = stage;
    c.zero.overlap_comm = overlap;
    return predict_step(c, memory, rates, one_ring_a_second);
  };
  // Stage 0: one all-reduce (2 s) beside the last backward (1.6 s).
  EXPECT_NEAR(predicted(0, true).communication, 0.4, 1e-9);
  EXPECT_NEAR(predicted(0, false).communication, 2.0, 1e-9);
  EXPECT_NEAR(predicted(0, true).comm_bytes, 2 * ring, 1e-6);
  // Stage 1: the reduce-scatter hidden by the last backward, the gather after the update not.
  EXPECT_NEAR(predicted(1, true).communication, gather_after_update, 1e-9);
  EXPECT_NEAR(predicted(1, false).communication, 1.0 + gather_after_update, 1e-9);
  // Stage 2: every micro-batch's reduction (1 s) hidden by its backward, or each exposed.
  EXPECT_NEAR(predicted(2, true).communication, gather_after_update, 1e-9);
  EXPECT_NEAR(predicted(2, false).communication, 3.0 + gather_after_update, 1e-9);
  // Stage 3: gathers of 1 s beside each forward of 0.8 s, and a gather and a reduction (2 s)
  // beside each backward of 1.6 s.
  const StepPrediction stage3 = predicted(3, true);
  EXPECT_NEAR(stage3.communication, 3 * 0.2 + 3 * 0.4, 1e-9);
  EXPECT_NEAR(stage3.comm_bytes, 3 * 3 * ring, 1e-6);
  EXPECT_NEAR(stage3.seconds(), 3 * 0.8 + 3 * 1.6 + 1.8, 1e-9);
  EXPECT_NEAR(predicted(3, false).communication, 9.0, 1e-9);
  // DeMo reduces no gradient: its own exchange (a fraction of a ring), in the update.
  json demo_json = small_config();
  demo_json["optimizer"] = {{"type", "DeMo"}};
  TrainConfig demo = parsed(demo_json);
  demo.micro_batch_size = 4;
  demo.gradient_accumulation_steps = 3;
  const double exchange = optimizer_family(OptimizerType::kDeMo)
                              .exchange_bytes(demo.optimizer, model_layout(demo.model), 4);
  EXPECT_GT(exchange, 0);
  EXPECT_LT(exchange, ring / 2);
  const StepPrediction demo_step = predict_step(demo, memory, rates, one_ring_a_second);
  EXPECT_DOUBLE_EQ(demo_step.comm_bytes, exchange);
  EXPECT_NEAR(demo_step.communication, exchange / ring, 1e-12);
  // One rank moves nothing; several with no rate known cannot be predicted.
  memory.world_size = 1;
  EXPECT_EQ(predicted(3, true).communication, 0);
  memory.world_size = 4;
  expect_error_naming([&] { predict_step(c, memory, rates); }, {"4 ranks", "rate"});
}

// Stage 3 gathers the parameters for every micro-batch: over a slow link the planner takes
// fewer, larger micro-batches than the compute alone would choose.
TEST(RankStepCandidates, ASlowLinkAtStage3ChoosesFewerMicroBatches) {
  TrainConfig c = auto_config(8);
  c.activation_checkpointing.interval = 0;
  c.zero.stage = 3;
  ComputeRates rates;  // a sequence costs 10% more in a micro-batch of 4 than alone
  rates.samples = {{.micro_batch = 1, .forward = {0.010, 0.002}, .backward = {0.020, 0.004}},
                   {.micro_batch = 4, .forward = {0.044, 0.0088}, .backward = {0.088, 0.0176}}};
  const auto memory_over = [](int ranks) {
    return [ranks](const TrainConfig&) {
      TrainingMemoryPlan plan;
      plan.device_capacity = 1;
      plan.world_size = ranks;
      return plan;
    };
  };
  const StepPlan alone = rank_step_candidates(c, 1, step_candidates(c, 1), rates, memory_over(1));
  EXPECT_EQ(alone.chosen().settings.micro_batch, 1) << alone.to_text();
  const double ring = 0.5 * static_cast<double>(c.model.num_parameters()) * 4;
  const StepPlan two = rank_step_candidates(c, 2, step_candidates(c, 2), rates, memory_over(2),
                                            CommRate{ring, "over a test link"});
  EXPECT_EQ(two.chosen().settings, (StepSettings{4, 1, 0, false})) << two.to_text();
  EXPECT_CONTAINS(two.to_text(), "communication between the 2 ranks over a test link");
  EXPECT_CONTAINS(two.to_text(), "+ communication ");
  EXPECT_EQ(alone.to_text().find("communication"), std::string::npos) << alone.to_text();
}

// A planner over a synthetic memory model: activations of B sequences take B units (half with
// recompute), the device holds 8, and the update shrinks with the room left for the state.
StepPlan synthetic_plan(const TrainConfig& config, const ComputeRates& rates) {
  const auto plan_memory = [](const TrainConfig& c) {
    TrainingMemoryPlan plan;
    const int B = c.micro_batch_size;
    plan.device_capacity = 8;
    plan.total.device =
        c.activation_checkpointing.interval > 0 ? static_cast<size_t>((B + 1) / 2) : B;
    plan.offload.subgroups = {{0, 1000, UpdateSite::kDeviceResident}};
    plan.prediction.seconds = 0.1 * static_cast<double>(plan.total.device);
    return plan;
  };
  return rank_step_candidates(config, 1, step_candidates(config, 1), rates, plan_memory);
}

TEST(RankStepCandidates, FastestFirstAndThoseThatDoNotFitSetAside) {
  TrainConfig c = auto_config(16);
  c.activation_checkpointing.interval = kAuto;
  ComputeRates rates;  // a GPU's: a sequence costs less in larger micro-batches
  rates.samples = {{.micro_batch = 1, .forward = {0.010, 0.004}, .backward = {0.020, 0.008}},
                   {.micro_batch = 16, .forward = {0.064, 0.032}, .backward = {0.128, 0.064}}};
  const StepPlan plan = synthetic_plan(c, rates);
  ASSERT_FALSE(plan.ranked.empty());
  EXPECT_EQ(plan.sequences_per_rank, 16);
  for (const StepSettings& s : plan.not_fitting)  // B = 16 fits only with recompute
    EXPECT_TRUE(s.micro_batch == 16 && s.recompute_interval == 0) << s.to_text();
  EXPECT_EQ(plan.not_fitting.size(), 1u);
  for (size_t i = 0; i < plan.ranked.size(); i++) {
    const StepCandidate& candidate = plan.ranked[i];
    const TrainConfig resolved = with_step_settings(c, candidate.settings, 1);
    const StepPrediction p = predict_step(resolved, candidate.memory, rates);
    EXPECT_DOUBLE_EQ(candidate.tokens_per_s, 16.0 * 64 / p.seconds());
    if (i > 0) {
      EXPECT_GE(plan.ranked[i - 1].tokens_per_s, candidate.tokens_per_s);
    }
  }
  // The best, computed here from the definition over every candidate that fits.
  double best = 0;
  StepSettings best_settings;
  for (const StepSettings& s : step_candidates(c, 1)) {
    const int units = s.recompute_interval > 0 ? (s.micro_batch + 1) / 2 : s.micro_batch;
    if (units > 8) continue;
    const double layer_f = rates.forward(s.micro_batch).layer,
                 rest_f = rates.forward(s.micro_batch).rest;
    const double layer_b = rates.backward(s.micro_batch).layer,
                 rest_b = rates.backward(s.micro_batch).rest;
    const double micro =
        6 * layer_f + rest_f + 6 * layer_b + rest_b + (s.recompute_interval > 0 ? 6 * layer_f : 0);
    const double seconds = s.accumulation * micro + 0.1 * units;
    if (16.0 * 64 / seconds > best * (1 + 1e-6)) best = 16.0 * 64 / seconds, best_settings = s;
  }
  EXPECT_EQ(plan.chosen().settings, best_settings) << plan.to_text();
  EXPECT_NEAR(plan.chosen().tokens_per_s, best, best * 1e-9);
  const std::string text = plan.to_text(2);
  EXPECT_NE(text.find("chosen: " + best_settings.to_text()), std::string::npos) << text;
  EXPECT_NE(text.find("runner-up 2"), std::string::npos) << text;
  EXPECT_EQ(text.find("runner-up 3"), std::string::npos) << text;
}

TEST(RankStepCandidates, EqualPredictionsPreferNoRecomputeThenTheLargerMicroBatch) {
  TrainConfig c = auto_config(4);
  ComputeRates flat;  // every split and recompute cost the same: no layer time at all
  flat.samples = {{.micro_batch = 1, .forward = {0, 0.01}, .backward = {0, 0.02}}};
  const auto plan_memory = [](const TrainConfig&) {
    TrainingMemoryPlan plan;
    plan.device_capacity = 1;
    return plan;
  };
  const StepPlan plan = rank_step_candidates(c, 1, step_candidates(c, 1), flat, plan_memory);
  EXPECT_EQ(plan.chosen().settings, (StepSettings{4, 1, 0, false}));
  EXPECT_EQ(plan.ranked[1].settings, (StepSettings{2, 2, 0, false}));
}

// llama2-7b's shape on an assumed H100 at the sweep's tokens per step, costed as `tandem plan`
// costs it without a GPU (the CPU's rate assumed too: nothing here depends on this machine).
TEST(StepPlanOn7B, EveryTokensPerStepPlansAndTheChoiceIsTheBestPredicted) {
  AssumedGpu gpu;
  gpu.cpu_params_per_s = 4e9;
  ThreadPool pool(1);
  double previous_tokens_per_s = 0;
  for (const int sequences : {4, 16, 64, 256}) {
    const TrainConfig c = load_train_config(
        testing::source_dir() / "configs" / "llama2-7b.json",
        {"device.memory_gb=76", "offload_optimizer.schedule=auto",
         "train_batch_size=" + std::to_string(sequences), "train_micro_batch_size_per_gpu=auto",
         "gradient_accumulation_steps=auto", "activation_checkpointing.interval=auto"});
    const StepPlan plan = plan_step_without_gpu(c, pool, 1, gpu);
    ASSERT_FALSE(plan.ranked.empty()) << sequences;
    const StepCandidate& chosen = plan.chosen();
    EXPECT_TRUE(chosen.memory.fits());
    EXPECT_EQ(chosen.settings.micro_batch * chosen.settings.accumulation, sequences);
    for (const StepCandidate& other : plan.ranked)
      EXPECT_LE(other.tokens_per_s, chosen.tokens_per_s);
    // More tokens per step spread the update over more compute.
    EXPECT_GT(chosen.tokens_per_s, previous_tokens_per_s) << plan.to_text();
    previous_tokens_per_s = chosen.tokens_per_s;
    // Bounded by compute alone: 400 TFLOPS of model FLOPs.
    EXPECT_LT(chosen.tokens_per_s, 400e12 / (3 * forward_flops_per_token(c.model, c.seq_len())));
  }
}

}  // namespace
}  // namespace tandem
