// `tandem bench offload`: update schedules side by side on one config
// (bench/offload_bench.h).
#include <memory>
#include <vector>

#include "tandem/bench/offload_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/config/train_config.h"
#include "tandem/core/error.h"
#include "tandem/offload/offload_plan.h"

namespace tandem::cli {

void register_bench_offload(CLI::App& bench) {
  struct Args {
    ConfigOptions config;
    std::vector<UpdateSchedule> schedules = {UpdateSchedule::kCpu, UpdateSchedule::kInterleave,
                                             UpdateSchedule::kAuto};
    int steps = 10;
    int warmup = 3;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "offload",
      "Update schedules side by side on one config, in one process: tokens/s, per-phase ms, "
      "predicted / measured update time, memory per tier, and one state digest for all");
  add_config_options(cmd, args->config);
  add_enum_list_option(cmd, "--schedules", args->schedules, kUpdateScheduleNames,
                       "Comma-separated offload_optimizer.schedule values, run in this order")
      ->delimiter(',');
  cmd->add_option("--steps", args->steps, "Timed steps per schedule (median)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", args->warmup, "Steps run first and not timed")
      ->check(CLI::Range(0, 100000));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    OffloadBenchOptions options;
    options.config = args->config.load();
    options.schedules = args->schedules;
    options.steps = args->steps;
    options.warmup = args->warmup;
    options.progress = progress_to_stderr("offload");
    const OffloadBenchResult result = run_offload_bench(options);
    print_result(result, args->json);
    if (result.schedules_run() == 0)
      fail(
          "tandem bench offload: no schedule fits the device (each one's reason is above); "
          "raise device.memory_gb or lower the micro-batch or sequence length");
    // Schedules that disagree on the bits are a bug, whatever the speed.
    if (!result.digests_agree())
      fail(
          "tandem bench offload: the schedules ended with different state digests; every "
          "schedule must compute the same bits (run test_schedules, and report this)");
  });
}

}  // namespace tandem::cli
