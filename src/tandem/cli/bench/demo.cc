// `tandem bench demo`: DeMo's step on the CPU and its DCT against sgemm (bench/demo_bench.h).
#include <memory>
#include <optional>

#include "tandem/bench/demo_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/core/cpu_features.h"

namespace tandem::cli {

void register_bench_demo(CLI::App& bench) {
  struct Args {
    int threads = 0;
    std::optional<SimdTarget> target;  // none: the best this CPU has
    int repetitions = 3;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "demo", "DeMo step throughput on the CPU, and its DCT's GFLOP/s next to OpenBLAS sgemm");
  cmd->add_option("--threads", args->threads, "Threads (default: one per CPU)")
      ->check(CLI::Range(0, 4096));
  add_enum_option(cmd, "--target", args->target, kSimdTargetNames,
                  "SIMD kernel (default: the best this CPU has)");
  cmd->add_option("--repetitions", args->repetitions, "Timed passes (best is reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    DemoBenchOptions options;
    options.threads = args->threads;
    warn_if_more_threads_than_cpus(args->threads);
    if (args->target) options.target = *args->target;
    options.repetitions = args->repetitions;
    print_result(run_demo_bench(options), args->json);
  });
}

}  // namespace tandem::cli
