// `tandem bench checkpoint-io`: a checkpoint's save and load alone, without training
// (bench/checkpoint_io_bench.h).
#include <memory>
#include <string>

#include "tandem/bench/checkpoint_io_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/config/train_config.h"

namespace tandem::cli {

void register_bench_checkpoint_io(CLI::App& bench) {
  struct Args {
    ConfigOptions config;
    std::string dir;
    int rounds = 5;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "checkpoint-io",
      "A checkpoint's synchronous save and the resume's read of it, alone (no training): "
      "milliseconds and GB/s of each");
  add_config_options(cmd, args->config);
  cmd->add_option("--dir", args->dir,
                  "Where to write (an existing directory on the disk to measure; "
                  "default: the system's temporary directory)");
  cmd->add_option("--rounds", args->rounds, "Saves and loads, alternating")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    CheckpointIoBenchOptions options;
    options.config = args->config.load();
    options.dir = args->dir;
    options.rounds = args->rounds;
    print_result(run_checkpoint_io_bench(options), args->json);
  });
}

}  // namespace tandem::cli
