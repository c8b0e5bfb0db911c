#include "tandem/bench/step_plan_bench.h"

#include <algorithm>
#include <cstdio>

#include "tandem/bench/offload_bench.h"
#include "tandem/config/memory_plan.h"
#include "tandem/core/error.h"
#include "tandem/core/format.h"
#include "tandem/core/thread_pool.h"
#include "tandem/core/timer.h"
#include "tandem/train/step_settings.h"
#include "tandem/train/trainer.h"

namespace tandem {

StepPlanBenchResult run_step_plan_bench(const StepPlanBenchOptions& options) {
  TANDEM_CHECK(options.config.has_auto_step_settings(),
               "tandem bench plan measures the choice of \"auto\" settings, and the config has "
               "none; set train_batch_size and train_micro_batch_size_per_gpu=auto (or "
               "gradient_accumulation_steps=auto, activation_checkpointing.interval=auto)");
  const int ranks = options.world_size;
  const StepPlan plan = plan_step_on_local_ranks(options.config, ranks);
  StepPlanBenchResult result;
  result.plan_text = plan.to_text();
  result.world_size = ranks;
  std::vector<std::vector<double>> measured(plan.ranked.size());
  for (const StepCandidate& candidate : plan.ranked)
    result.rows.push_back({.settings = candidate.settings,
                           .predicted_tokens_per_s = candidate.tokens_per_s,
                           .measured_tokens_per_s = 0,
                           .state_digest = {}});
  for (int round = 0; round < options.rounds; round++) {
    for (size_t i = 0; i < plan.ranked.size(); i++) {
      StepPlanBenchResult::Row& row = result.rows[i];
      if (options.progress)
        options.progress(cat("round ", round + 1, " of ", options.rounds, ": ",
                             row.settings.to_text(), " (", i + 1, " of ", plan.ranked.size(), ")"));
      const TrainResult run =
          train_for_bench(with_step_settings(options.config, row.settings, ranks), options.warmup,
                          options.steps, ranks);
      measured[i].push_back(step_medians(run, options.warmup).tokens_per_s / ranks);
      row.state_digest = run.state_digest;
    }
  }
  for (size_t i = 0; i < result.rows.size(); i++)
    result.rows[i].measured_tokens_per_s = median(measured[i]);
  return result;
}

double StepPlanBenchResult::chosen_to_best_measured() const {
  double best = 0;
  for (const Row& row : rows) best = std::max(best, row.measured_tokens_per_s);
  return rows.empty() || best == 0 ? 0 : rows.front().measured_tokens_per_s / best;
}

std::string StepPlanBenchResult::to_text() const {
  std::string text =
      plan_text + "measured (the planner's order, the chosen first" +
      (world_size > 1 ? cat("; per rank of ", world_size, " in-process ranks") : std::string()) +
      "):\n" + "predicted tok/s  measured tok/s  measured/predicted  setting\n";
  for (const Row& row : rows) {
    char line[160];
    std::snprintf(line, sizeof line, "%15.0f  %14.0f  %18.3f  ", row.predicted_tokens_per_s,
                  row.measured_tokens_per_s,
                  row.predicted_tokens_per_s > 0
                      ? row.measured_tokens_per_s / row.predicted_tokens_per_s
                      : 0.0);
    text += line + row.settings.to_text() + "\n";
  }
  return text + cat("the chosen setting's measured tokens/s / the best measured: ",
                    format_fixed(chosen_to_best_measured(), 3), " (goal: at least 0.9)\n");
}

nlohmann::json StepPlanBenchResult::to_json() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const Row& row : rows)
    rows_json.push_back({{"micro_batch", row.settings.micro_batch},
                         {"gradient_accumulation_steps", row.settings.accumulation},
                         {"recompute_interval", row.settings.recompute_interval},
                         {"cpu_checkpointing", row.settings.cpu_checkpointing},
                         {"predicted_tokens_per_s", row.predicted_tokens_per_s},
                         {"measured_tokens_per_s", row.measured_tokens_per_s},
                         {"state_digest", row.state_digest}});
  return {{"plan", plan_text},
          {"world_size", world_size},
          {"rows", rows_json},
          {"chosen_to_best_measured", chosen_to_best_measured()}};
}

}  // namespace tandem
