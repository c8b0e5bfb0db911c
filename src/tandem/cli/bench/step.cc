// `tandem bench step`: a config's training-step throughput and per-phase times, from a
// short run without checkpoints (train/trainer.h).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/bench/offload_bench.h"  // step_medians
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/config/train_config.h"
#include "tandem/train/step_settings.h"
#include "tandem/train/trainer.h"

namespace tandem::cli {
namespace {

struct Args {
  ConfigOptions config;
  int steps = 10;
  int warmup = 3;
  bool json = false;
};

// The run's figures: medians over the timed steps (robust to a noisy neighbour on a
// shared machine), what was run, and every step's loss.
nlohmann::json step_report(const Args& args, const TrainConfig& config, const TrainResult& result) {
  const StepMedians m = step_medians(result, args.warmup);
  std::vector<double> losses;
  for (const StepRecord& r : result.steps) losses.push_back(r.loss);
  return {{"tokens_per_s", m.tokens_per_s},
          {"ms", m.ms},
          {"forward_ms", m.forward_ms},
          {"backward_ms", m.backward_ms},
          {"update_ms", m.update_ms},
          {"predicted_update_ms", result.plan.prediction.seconds * 1e3},
          {"params", config.model.num_parameters()},
          {"batch", config.micro_batch_size},
          {"seq_len", config.seq_len()},
          {"gradient_accumulation_steps", config.gradient_accumulation_steps},
          {"schedule", std::string(update_schedule_name(config.offload.schedule))},
          {"device", std::string(device_kind_name(config.device.type))},
          {"device_bytes", result.plan.total.device},
          {"pinned_host_bytes", result.plan.total.pinned_host},
          {"timed_steps", args.steps},
          {"state_digest", result.state_digest},
          {"losses", losses}};
}

void print_step_text(const Args& args, const TrainConfig& config, const nlohmann::json& report) {
  std::printf(
      "tandem bench step: %ld parameters, %d x %d tokens x %d micro-batches, schedule %s, "
      "%s device\n  %.0f tokens/s, %.1f ms/step (forward %.1f, backward %.1f, update %.1f); "
      "medians of %d steps after %d warm-up\n",
      static_cast<long>(config.model.num_parameters()), config.micro_batch_size, config.seq_len(),
      config.gradient_accumulation_steps,
      std::string(update_schedule_name(config.offload.schedule)).c_str(),
      std::string(device_kind_name(config.device.type)).c_str(),
      report["tokens_per_s"].get<double>(), report["ms"].get<double>(),
      report["forward_ms"].get<double>(), report["backward_ms"].get<double>(),
      report["update_ms"].get<double>(), args.steps, args.warmup);
}

}  // namespace

void register_bench_step(CLI::App& bench) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "step", "Training-step throughput: tokens/s and per-phase ms for a config and schedule");
  add_config_options(cmd, args->config);
  cmd->add_option("--steps", args->steps, "Timed steps (the median is reported)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", args->warmup, "Steps run first and not timed")
      ->check(CLI::Range(0, 100000));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    const TrainConfig config =
        with_chosen_step_settings(args->config.load(), args->json ? nullptr : stderr);
    const TrainResult result = train_for_bench(config, args->warmup, args->steps);
    const nlohmann::json report = step_report(*args, config, result);
    if (args->json)
      std::printf("%s\n", report.dump().c_str());
    else
      print_step_text(*args, config, report);
  });
}

}  // namespace tandem::cli
