// "auto" settings in whole runs (train/step_settings.h): the planner's choice trains and is
// what the checkpoint records, ranks take rank 0's, a resume keeps the checkpoint's, and the
// compute calibration measures on the cpu device, alone and over ranks that share its cores,
// and so does the update's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "support/train_on_ranks.h"
#include "tandem/ckpt/train_checkpoint.h"
#include "tandem/comm/local_group.h"
#include "tandem/config/compute_calibration.h"
#include "tandem/config/memory_plan.h"
#include "tandem/config/step_plan.h"
#include "tandem/core/file_io.h"
#include "tandem/core/thread_pool.h"
#include "tandem/model/model_family.h"
#include "tandem/train/step_settings.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {

using json = nlohmann::json;

json auto_run_config(const testing::ScratchDir& dir, const std::string& name, int sequences) {
  json j = testing::tiny_run_config(dir / "data.txt", dir / name);
  j["train_batch_size"] = sequences;
  j["train_micro_batch_size_per_gpu"] = "auto";
  j["gradient_accumulation_steps"] = "auto";
  j["activation_checkpointing"] = {{"interval", "auto"}};
  j["train"]["steps"] = 6;
  j["train"]["eval_interval"] = 0;
  return j;
}

StepSettings recorded_settings(const std::filesystem::path& checkpoint) {
  const TrainConfig c = read_training_state(checkpoint).config;
  return {c.micro_batch_size, c.gradient_accumulation_steps, c.activation_checkpointing.interval,
          c.activation_checkpointing.cpu_checkpointing};
}

TEST(StepSettings, AnAutoRunTrainsWithTheChoiceAndRecordsIt) {
  testing::ScratchDir dir("step_settings");
  testing::write_small_corpus(dir / "data.txt");
  const TrainConfig config = parse_train_config(auto_run_config(dir, "auto", 8));
  const TrainResult run = train(config, testing::quiet());
  ASSERT_EQ(run.steps_done, 6);
  const StepSettings chosen = recorded_settings(run.last_checkpoint);
  EXPECT_EQ(chosen.micro_batch * chosen.accumulation, 8);
  EXPECT_FALSE(read_training_state(run.last_checkpoint).config.has_auto_step_settings());
  // The same settings written as numbers give the same bits.
  json fixed = testing::tiny_run_config(dir / "data.txt", dir / "fixed");
  fixed["train_micro_batch_size_per_gpu"] = chosen.micro_batch;
  fixed["gradient_accumulation_steps"] = chosen.accumulation;
  fixed["activation_checkpointing"] = {{"interval", chosen.recompute_interval},
                                       {"cpu_checkpointing", chosen.cpu_checkpointing}};
  fixed["train"]["steps"] = 6;
  fixed["train"]["eval_interval"] = 0;
  const TrainResult again = train(parse_train_config(fixed), testing::quiet());
  EXPECT_EQ(again.state_digest, run.state_digest);
  EXPECT_EQ(testing::losses(again), testing::losses(run));
}

TEST(StepSettings, EveryRankTakesRankZerosChoice) {
  testing::ScratchDir dir("step_settings_ranks");
  testing::write_small_corpus(dir / "data.txt");
  const testing::RankResults results = testing::train_on_ranks(2, auto_run_config(dir, "r", 8));
  testing::expect_ranks_agree(results, "2 ranks, \"auto\"");
  const StepSettings chosen = recorded_settings(results.by_rank[0].last_checkpoint);
  EXPECT_EQ(chosen.micro_batch * chosen.accumulation * 2, 8);
  // 8 sequences over 3 ranks do not split: every rank refuses, naming the fix.
  const testing::RankResults three = testing::train_on_ranks(3, auto_run_config(dir, "r3", 8));
  for (const std::string& error : three.errors) EXPECT_CONTAINS(error, "multiple of 3");
}

// Over several ranks, all of them measure how fast their data moves and rank 0 plans with it:
// the plan it logs costs each candidate's communication.
TEST(StepSettings, TheRanksMeasureTheirRateAndRankZeroPlansWithIt) {
  testing::ScratchDir dir("step_settings_comm");
  testing::write_small_corpus(dir / "data.txt");
  json j = auto_run_config(dir, "c", 8);
  j["zero_optimization"] = {{"stage", 2}};
  const TrainConfig config = parse_train_config(j);
  std::string plan_text;
  std::vector<TrainConfig> chosen(2);
  run_local_ranks(2, [&](Communicator& comm) {
    std::FILE* log = comm.rank() == 0 ? std::tmpfile() : nullptr;
    chosen[comm.rank()] = with_chosen_step_settings(config, comm, {}, log);
    if (log == nullptr) return;
    std::rewind(log);
    for (int c; (c = std::fgetc(log)) != EOF;) plan_text += static_cast<char>(c);
    std::fclose(log);
  });
  EXPECT_CONTAINS(plan_text, "communication between the 2 ranks measured: local all-reduce");
  EXPECT_CONTAINS(plan_text, "iB sent)");
  EXPECT_EQ(chosen[0].micro_batch_size, chosen[1].micro_batch_size);
  EXPECT_EQ(chosen[0].gradient_accumulation_steps, chosen[1].gradient_accumulation_steps);
}

TEST(StepSettings, AResumeKeepsTheCheckpointsSettings) {
  testing::ScratchDir dir("step_settings_resume");
  testing::write_small_corpus(dir / "data.txt");
  // A run with settings the planner would not choose (one sequence at a time, recomputing),
  // stopped half-way.
  json first = auto_run_config(dir, "run", 8);
  first["train_micro_batch_size_per_gpu"] = 1;
  first["gradient_accumulation_steps"] = 8;
  first["activation_checkpointing"] = {{"interval", 1}};
  TrainOptions half = testing::quiet();
  half.stop_at_step = 3;
  ASSERT_EQ(train(parse_train_config(first), half).steps_done, 3);
  // Resumed with "auto": the checkpoint's settings, and the run goes on to its end.
  const TrainConfig automatic = parse_train_config(auto_run_config(dir, "run", 8));
  LocalGroup single(1);
  const TrainConfig kept =
      with_chosen_step_settings(automatic, *single.communicator(0), dir / "run", nullptr);
  EXPECT_EQ(kept.micro_batch_size, 1);
  EXPECT_EQ(kept.gradient_accumulation_steps, 8);
  EXPECT_EQ(kept.activation_checkpointing.interval, 1);
  TrainOptions resume = testing::quiet();
  resume.resume = dir / "run";
  const TrainResult rest = train(automatic, resume);
  EXPECT_EQ(rest.steps_done, 6);
  EXPECT_EQ(recorded_settings(rest.last_checkpoint), (StepSettings{1, 8, 1, false}));
  // Asked for another batch per step, the checkpoint's settings do not make it: planned
  // afresh (and the resume's checks then name the difference).
  const TrainConfig other = parse_train_config(auto_run_config(dir, "run", 16));
  const TrainConfig planned =
      with_chosen_step_settings(other, *single.communicator(0), dir / "run", nullptr);
  EXPECT_EQ(planned.micro_batch_size * planned.gradient_accumulation_steps, 16);
}

TEST(StepSettings, FixedSettingsAndABatchThatDoesNotMatchAreRefused) {
  testing::ScratchDir dir("step_settings_fixed");
  testing::write_small_corpus(dir / "data.txt");
  json j = testing::tiny_run_config(dir / "data.txt", dir / "x");
  j["train_batch_size"] = 12;  // 4 x 2 x 1 = 8
  EXPECT_CONTAINS(testing::error_of([&] { train(parse_train_config(j), testing::quiet()); }),
                  "4 x 2 x 1 = 8");
  EXPECT_FALSE(std::filesystem::exists(dir / "x" / "checkpoints"));
}

TEST(ComputeCalibration, MeasuresEachMicroBatchOnTheCpuDevice) {
  testing::ScratchDir dir("calibration");
  TrainConfig config = parse_train_config(testing::tiny_run_config(dir / "d.txt", dir / "o"));
  const std::unique_ptr<Device> device = make_training_device(config);
  const ComputeRates rates = calibrate_compute_rates(config, *device, {4, 1, 4}, 2);
  ASSERT_EQ(rates.samples.size(), 2u);
  EXPECT_EQ(rates.samples[0].micro_batch, 1);
  EXPECT_EQ(rates.samples[1].micro_batch, 4);
  for (const ComputeRates::Sample& s : rates.samples) {
    EXPECT_GT(s.forward.layer, 0);
    EXPECT_GT(s.backward.layer, 0);
    EXPECT_GE(s.forward.rest, 0);
    EXPECT_LT(s.forward.of(2), 1.0) << "a tiny model's pass takes milliseconds";
  }
  EXPECT_CONTAINS(rates.source, "measured on the cpu device");
  // The whole plan on that device: every candidate of 8 sequences fits, the best first.
  config.train_batch_size = 8;
  config.micro_batch_size = kAuto;
  config.gradient_accumulation_steps = kAuto;
  ThreadPool pool(1);
  const StepPlan plan = plan_step(config, *device, pool);
  EXPECT_EQ(plan.ranked.size(), 4u);  // 1x8, 2x4, 4x2, 8x1, without recompute
  EXPECT_TRUE(plan.not_fitting.empty());
  EXPECT_CONTAINS(plan.to_text(), "chosen: micro-batch");
}

// Ranks that calibrate together (as a run's ranks on one machine's cores do) time rank 0's
// micro-batches, only those every rank's device holds, each pass started together and timed
// as the slowest rank's: every rank ends with the same rates, to the bit.
TEST(ComputeCalibration, RanksTimeTogetherWhatEveryRankHolds) {
  testing::ScratchDir dir("calibration_ranks");
  const TrainConfig config = parse_train_config(testing::tiny_run_config(dir / "d.txt", dir / "o"));
  // Rank 1's device holds a two-layer model at a micro-batch of 4, not of 8 (the calibration's
  // estimate: parameters and gradients, activations, a tenth more).
  ModelConfig two_layers = config.model;
  two_layers.n_layer = 2;
  const size_t e = storage_dtype_bytes(config.storage_dtype());
  const auto bytes = [&](int B) {
    return (model_layout(two_layers).num_elements() * 2 * e +
            model_activation_bytes(two_layers, B, config.seq_len(), config.storage_dtype())) /
           10 * 11;
  };
  std::vector<ComputeRates> rates(2);
  run_local_ranks(2, [&](Communicator& comm) {
    CpuDeviceOptions options;
    if (comm.rank() == 1) options.memory_bytes = (bytes(4) + bytes(8)) / 2;
    const std::unique_ptr<Device> device = make_cpu_device(options);
    // Rank 1 asks for others: rank 0's decide.
    const std::vector<int> wanted = comm.rank() == 0 ? std::vector<int>{1, 4, 8} : std::vector{2};
    rates[comm.rank()] = calibrate_compute_rates(config, *device, wanted, 3, &comm);
  });
  for (const ComputeRates& r : rates) {
    ASSERT_EQ(r.samples.size(), 2u);
    EXPECT_EQ(r.samples[0].micro_batch, 1);
    EXPECT_EQ(r.samples[1].micro_batch, 4);
    EXPECT_CONTAINS(r.source, "2 ranks in step, the slowest's, median of 3 passes");
  }
  for (size_t i = 0; i < 2; i++) {
    EXPECT_EQ(rates[0].samples[i].forward.layer, rates[1].samples[i].forward.layer);
    EXPECT_EQ(rates[0].samples[i].forward.rest, rates[1].samples[i].forward.rest);
    EXPECT_EQ(rates[0].samples[i].backward.layer, rates[1].samples[i].backward.layer);
    EXPECT_EQ(rates[0].samples[i].backward.rest, rates[1].samples[i].backward.rest);
  }
}

// A plan for many ranks is measured by no more ranks than this process has CPUs, and by at
// least two of several (their communication is measured too).
TEST(StepSettings, RanksPlanningHereAreAtMostTheCpus) {
  const int cpus = static_cast<int>(allowed_cpus().size());
  EXPECT_EQ(ranks_planning_here(1), 1);
  EXPECT_EQ(ranks_planning_here(2), 2);
  EXPECT_EQ(ranks_planning_here(3), std::min(3, std::max(2, cpus)));
  EXPECT_EQ(ranks_planning_here(4096), std::max(2, cpus));
}

// Ranks that plan at once (as a run's ranks on one machine do) time the update together and
// keep the slowest rank's rates: every rank ends with the same rates, to the bit, and says how
// they were measured. Where one rank's plan cannot fit, no rank times anything (and none waits
// for it).
TEST(UpdateCalibration, RanksTimeTheUpdateTogetherAndKeepTheSlowestsRates) {
  testing::ScratchDir dir("update_calibration_ranks");
  json j = testing::tiny_run_config(dir / "d.txt", dir / "o");
  j["offload_optimizer"] = {{"schedule", "auto"}};
  const TrainConfig config = parse_train_config(j);
  const auto measure = [&](size_t rank1_device_bytes) {
    std::vector<std::optional<UpdateRates>> rates(2);
    run_local_ranks(2, [&](Communicator& comm) {
      CpuDeviceOptions options;
      if (comm.rank() == 1) options.memory_bytes = rank1_device_bytes;
      const std::unique_ptr<Device> device = make_cpu_device(options);
      ThreadPool pool(1);
      rates[comm.rank()] = measure_update_rates(config, *device, pool,
                                                zero_state_range(config, 2, comm.rank()), 2, &comm);
    });
    return rates;
  };
  const std::vector<std::optional<UpdateRates>> together = measure(size_t{1} << 30);
  ASSERT_TRUE(together[0] && together[1]);
  const UpdateRates& a = *together[0];
  const UpdateRates& b = *together[1];
  for (double UpdateRates::*rate :
       {&UpdateRates::cpu_params_per_s, &UpdateRates::device_params_per_s,
        &UpdateRates::h2d_bytes_per_s, &UpdateRates::d2h_bytes_per_s}) {
    EXPECT_GT(a.*rate, 0);
    EXPECT_EQ(a.*rate, b.*rate);
  }
  for (SharedRates UpdateRates::*lanes : {&UpdateRates::shared, &UpdateRates::shared_h2d}) {
    EXPECT_EQ((a.*lanes).cpu_params_per_s, (b.*lanes).cpu_params_per_s);
    EXPECT_EQ((a.*lanes).device_params_per_s, (b.*lanes).device_params_per_s);
    EXPECT_EQ((a.*lanes).h2d_bytes_per_s, (b.*lanes).h2d_bytes_per_s);
    EXPECT_EQ((a.*lanes).d2h_bytes_per_s, (b.*lanes).d2h_bytes_per_s);
  }
  EXPECT_EQ(a.ranks_at_once, 2);
  EXPECT_CONTAINS(a.to_text(), "each the slowest of 2 ranks measuring at once");
  // Rank 1's device is too small for its plan: neither rank measures.
  const std::vector<std::optional<UpdateRates>> one_short = measure(4096);
  EXPECT_FALSE(one_short[0]);
  EXPECT_FALSE(one_short[1]);
}

}  // namespace
}  // namespace tandem
