// `tandem bench adamw`: AdamW's throughput against the machine's memory bandwidth, on the
// CPU (bench/adamw_bench.h) or the GPU (bench/device_bench.h).
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "tandem/bench/adamw_bench.h"
#include "tandem/bench/device_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/core/cpu_features.h"
#include "tandem/device/cuda/cuda_device.h"
#include "tandem/device/device_kind.h"
#include "tandem/offload/update_types.h"

namespace tandem::cli {

void register_bench_adamw(CLI::App& bench) {
  struct Args {
    double params = 1e8;
    GradDType grad_dtype = GradDType::kF32;
    WorkingDType param_dtype = WorkingDType::kBF16;
    int threads = 0;
    std::optional<SimdTarget> target;  // none: the best this CPU has
    int repetitions = 5;
    bool json = false;
    DeviceKind device = DeviceKind::kHostOnly;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "adamw", "CPU AdamW throughput and its ratio to a STREAM triad measured in the same run");
  cmd->add_option("--params", args->params, "Parameters to update (e.g. 1e8)")
      ->check(CLI::Range(1.0, 1e11));
  add_enum_option(cmd, "--grad-dtype", args->grad_dtype, kGradDTypeNames, "Gradient type");
  add_enum_option(cmd, "--param-dtype", args->param_dtype, kWorkingDTypeNames,
                  "16-bit working copy written in the same pass",
                  {WorkingDType::kBF16, WorkingDType::kF16, WorkingDType::kNone});
  cmd->add_option("--threads", args->threads, "Threads (default: one per CPU)")
      ->check(CLI::Range(0, 4096));
  add_enum_option(cmd, "--target", args->target, kSimdTargetNames,
                  "SIMD kernel (default: the best this CPU has)");
  cmd->add_option("--repetitions", args->repetitions, "Timed passes (best is reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  add_enum_option(cmd, "--device", args->device, kDeviceKindNames,
                  "cpu: the CPU kernel vs a triad; cuda: the GPU kernel vs a device copy");
  cmd->callback([args] {
    if (args->device == DeviceKind::kCuda) {
      auto device = make_cuda_device({});
      const DeviceAdamWBenchResult r =
          run_device_adamw_bench(*device, static_cast<size_t>(args->params), args->repetitions);
      print_result(r, args->json, device->name());
      return;
    }
    AdamWBenchOptions options;
    options.params = static_cast<size_t>(args->params);
    options.grad_dtype = args->grad_dtype;
    options.working_dtype = args->param_dtype;
    options.threads = args->threads;
    warn_if_more_threads_than_cpus(args->threads);
    if (args->target) options.target = *args->target;
    options.repetitions = args->repetitions;
    print_result(run_adamw_bench(options), args->json);
  });
}

}  // namespace tandem::cli
