// `tandem bench`: its subcommands, one per file of cli/bench/.
#include <CLI/CLI.hpp>

#include "tandem/cli/bench/bench_commands.h"
#include "tandem/cli/commands.h"

namespace tandem::cli {

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure kernels against the machine's limits");
  bench->require_subcommand(1);
  // In the order `tandem bench --help` lists them.
  for (void (*add)(CLI::App&) :
       {register_bench_plan, register_bench_adamw, register_bench_demo, register_bench_checkpoint,
        register_bench_checkpoint_io, register_bench_pcie, register_bench_step,
        register_bench_offload, register_bench_versus, register_bench_zero})
    add(*bench);
}

}  // namespace tandem::cli
