// `tandem bench versus`: a config against the same config with settings changed, in
// alternating rounds (bench/versus_bench.h).
#include <memory>
#include <string>
#include <vector>

#include "tandem/bench/versus_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"

namespace tandem::cli {

void register_bench_versus(CLI::App& bench) {
  struct Args {
    ConfigOptions config;
    std::vector<std::string> versus;
    int rounds = 3;
    int steps = 10;
    int warmup = 3;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "versus",
      "A config against the same config with settings changed (--versus KEY=VALUE), trained in "
      "alternating rounds in one process: the ratio of their step times, and their state digests");
  add_config_options(cmd, args->config, "Override a config value on both sides");
  cmd->add_option("--versus", args->versus,
                  "A setting the variant changes (repeatable), e.g. "
                  "activation_checkpointing.interval=1")
      ->required();
  cmd->add_option("--rounds", args->rounds, "Runs of each side, alternating")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--steps", args->steps, "Timed steps per run (the median is taken)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", args->warmup, "Steps run first in each run, not timed")
      ->check(CLI::Range(0, 100000));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    VersusBenchOptions options;
    options.base = args->config.load();
    ConfigOptions variant = args->config;
    variant.overrides.insert(variant.overrides.end(), args->versus.begin(), args->versus.end());
    options.variant = variant.load();
    options.changes = args->versus;
    options.rounds = args->rounds;
    options.steps = args->steps;
    options.warmup = args->warmup;
    options.progress = progress_to_stderr("versus");
    const VersusBenchResult result = run_versus_bench(options);
    print_result(result, args->json);
    if (result.digests_unexplained())
      fail(
          "tandem bench versus: the two sides ended with different state digests; the settings "
          "it compares must not change a number (run the tests, and report this)");
  });
}

}  // namespace tandem::cli
