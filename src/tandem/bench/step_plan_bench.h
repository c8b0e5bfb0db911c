// `tandem bench plan`: does the step planner (config/step_plan.h) choose well? The config's
// "auto" settings are planned as a run plans them, then every candidate that fits is trained
// for a few steps, the candidates in turn and the whole grid `rounds` times over (a neighbour's
// load then falls on all alike): each one's predicted and measured tokens/s, and the chosen
// one's measured tokens/s over the best measured (the goal: at least 0.9). With world_size > 1
// the ranks are threads of this process (in-process ranks, sharing its CPUs): they plan at
// once, as a run's ranks do, rank 0's plan deciding, and every figure is per rank.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/config/step_plan.h"
#include "tandem/config/train_config.h"

namespace tandem {

struct StepPlanBenchOptions {
  TrainConfig config;  // with "auto" settings
  int steps = 4, warmup = 2, rounds = 2;
  int world_size = 1;
  std::function<void(const std::string&)> progress;
};

struct StepPlanBenchResult {
  struct Row {
    StepSettings settings;
    double predicted_tokens_per_s = 0;  // per rank
    double measured_tokens_per_s = 0;   // per rank: the median of its rounds' medians
    std::string state_digest;
  };
  std::vector<Row> rows;  // the planner's order: the chosen first
  std::string plan_text;  // what `tandem plan` prints of it
  int world_size = 1;     // in-process ranks
  // The chosen row's measured tokens/s over the best measured row's.
  double chosen_to_best_measured() const;
  std::string to_text() const;
  nlohmann::json to_json() const;
};

StepPlanBenchResult run_step_plan_bench(const StepPlanBenchOptions& options);

}  // namespace tandem
