// `tandem bench zero`: each ZeRO stage at each world size, ranks launched with mpirun
// (bench/zero_bench.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "tandem/bench/zero_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/config/train_config.h"

namespace tandem::cli {

void register_bench_zero(CLI::App& bench) {
  struct Args {
    ConfigOptions config;
    std::vector<int> world_sizes = {1, 2, 4};
    std::vector<int> stages = {0, 1, 2, 3};
    int steps = 5;
    int warmup = 2;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "zero",
      "Each ZeRO stage at each world size (ranks launched with mpirun): s/step, bytes per rank "
      "per tier, bytes per rank per step");
  add_config_options(cmd, args->config);
  cmd->add_option("--world-sizes", args->world_sizes, "Comma-separated, e.g. 1,2,4")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--stages", args->stages, "Comma-separated ZeRO stages (0-3)")
      ->delimiter(',')
      ->check(CLI::Range(0, 3));
  cmd->add_option("--steps", args->steps, "Timed steps per run (the median is reported)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", args->warmup, "Steps run first and not timed")
      ->check(CLI::Range(0, 100000));
  cmd->add_flag("--json", args->json, "Print a JSON array, one object per run");
  cmd->callback([args] {
    // Refuse a bad config here, once, rather than in every launched run.
    args->config.load();
    ZeroBenchOptions options;
    options.config = args->config.path;
    options.overrides = args->config.overrides;
    options.world_sizes = args->world_sizes;
    options.stages = args->stages;
    options.steps = args->steps;
    options.warmup = args->warmup;
    options.tandem_binary = std::filesystem::read_symlink("/proc/self/exe");
    options.progress = progress_to_stderr("zero");
    const std::vector<ZeroBenchCase> cases = run_zero_bench(options);
    if (args->json) {
      std::printf("%s\n", zero_bench_json(cases).dump().c_str());
      return;
    }
    std::fputs(zero_bench_table(cases).c_str(), stdout);
  });
}

}  // namespace tandem::cli
