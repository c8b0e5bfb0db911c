// `tandem bench plan`: the step planner's choice against a measured grid (bench/step_plan_bench.h).
#include <cstdio>
#include <memory>
#include <string>

#include "tandem/bench/step_plan_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/config/train_config.h"

namespace tandem::cli {

void register_bench_plan(CLI::App& bench) {
  struct Args {
    ConfigOptions config;
    int steps = 4, warmup = 2, rounds = 2;
    int world_size = 1;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "plan",
      "The step planner's choice for a config's \"auto\" settings against every candidate that "
      "fits, each trained in alternating rounds: predicted and measured tokens/s");
  add_config_options(cmd, args->config);
  cmd->add_option("--steps", args->steps, "Timed steps per candidate and round (median)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", args->warmup, "Steps run first and not timed")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--rounds", args->rounds, "Passes over the grid (the median of each's)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--world-size", args->world_size,
                  "Plan and train over this many in-process ranks (threads of this process, "
                  "sharing its CPUs; zero_optimization.stage decides what each holds); figures "
                  "per rank")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    StepPlanBenchOptions options;
    options.config = args->config.load();
    options.steps = args->steps;
    options.warmup = args->warmup;
    options.rounds = args->rounds;
    options.world_size = args->world_size;
    options.progress = progress_to_stderr("plan");
    print_result(run_step_plan_bench(options), args->json);
  });
}

}  // namespace tandem::cli
