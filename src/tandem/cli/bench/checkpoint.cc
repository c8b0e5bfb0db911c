// `tandem bench checkpoint`: synchronous, lazy and streamed checkpoints on one run
// (bench/checkpoint_bench.h).
#include <cstdint>
#include <memory>

#include "tandem/bench/checkpoint_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/config/train_config.h"

namespace tandem::cli {

void register_bench_checkpoint(CLI::App& bench) {
  struct Args {
    ConfigOptions config;
    int64_t steps = 30;
    int64_t interval = 5;
    int64_t pool_mb = 0;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "checkpoint",
      "Synchronous, lazy and streamed (through a bounded pool) checkpoints on the same run: "
      "each checkpoint's stall as a fraction of a step, and its flush time");
  add_config_options(cmd, args->config);
  cmd->add_option("--steps", args->steps, "Steps per mode")
      ->check(CLI::Range(int64_t{2}, int64_t{1000000}));
  cmd->add_option("--interval", args->interval, "A checkpoint every N steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  cmd->add_option("--pool-mb", args->pool_mb,
                  "The streamed mode's pool in MiB (default: an eighth of the state)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    CheckpointBenchOptions options;
    options.config = args->config.load();
    options.steps = args->steps;
    options.interval = args->interval;
    options.pool_mb = args->pool_mb;
    print_result(run_checkpoint_bench(options), args->json);
  });
}

}  // namespace tandem::cli
