#include <cstdio>
#include <memory>
#include <string>

#include "tandem/bench/adamw_bench.h"
#include "tandem/bench/device_bench.h"
#include "tandem/cli/commands.h"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_device.h"

namespace tandem::cli {

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure kernels against the machine's limits");
  bench->require_subcommand(1);

  struct AdamWArgs {
    double params = 1e8;
    std::string grad_dtype = "fp32";
    std::string param_dtype = "bf16";
    int threads = 0;
    std::string target;
    int repetitions = 5;
    bool json = false;
    std::string device = "cpu";
  };
  auto args = std::make_shared<AdamWArgs>();
  CLI::App* adamw = bench->add_subcommand(
      "adamw", "CPU AdamW throughput and its ratio to a STREAM triad measured in the same run");
  adamw->add_option("--params", args->params, "Parameters to update (e.g. 1e8)")
      ->check(CLI::Range(1.0, 1e11));
  adamw->add_option("--grad-dtype", args->grad_dtype, "Gradient type")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  adamw
      ->add_option("--param-dtype", args->param_dtype,
                   "16-bit working copy written in the same pass")
      ->check(CLI::IsMember({"bf16", "fp16", "none"}));
  adamw->add_option("--threads", args->threads, "Threads (default: one per CPU)")
      ->check(CLI::Range(0, 4096));
  adamw->add_option("--target", args->target, "SIMD kernel (default: the best this CPU has)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  adamw->add_option("--repetitions", args->repetitions, "Timed passes (best is reported)")
      ->check(CLI::Range(1, 1000));
  adamw->add_flag("--json", args->json, "Print one JSON object");
  adamw
      ->add_option("--device", args->device,
                   "cpu: the CPU kernel vs a triad; cuda: the GPU kernel vs a device copy")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  adamw->callback([args] {
    if (args->device == "cuda") {
      auto device = make_cuda_device({});
      const DeviceAdamWBenchResult r =
          run_device_adamw_bench(*device, static_cast<size_t>(args->params), args->repetitions);
      const std::string out = args->json ? r.to_json().dump() + "\n" : r.to_text(device->name());
      std::fputs(out.c_str(), stdout);
      return;
    }
    AdamWBenchOptions options;
    options.params = static_cast<size_t>(args->params);
    options.grad_dtype = args->grad_dtype == "bf16" ? GradDType::kBF16 : GradDType::kF32;
    options.working_dtype = args->param_dtype == "none"   ? WorkingDType::kNone
                            : args->param_dtype == "fp16" ? WorkingDType::kF16
                                                          : WorkingDType::kBF16;
    options.threads = args->threads;
    if (!args->target.empty()) options.target = *parse_simd_target(args->target);
    options.repetitions = args->repetitions;
    const AdamWBenchResult result = run_adamw_bench(options);
    const std::string out = args->json ? result.to_json().dump() + "\n" : result.to_text();
    std::fputs(out.c_str(), stdout);
  });

  struct PcieArgs {
    double bytes = 256.0 * (1 << 20);
    int repetitions = 5;
    bool json = false;
  };
  auto pcie_args = std::make_shared<PcieArgs>();
  CLI::App* pcie = bench->add_subcommand(
      "pcie", "Pinned host-to-device, device-to-host and both-at-once copy bandwidth (GPU)");
  pcie->add_option("--bytes", pcie_args->bytes, "Bytes per copy")->check(CLI::Range(1.0, 1e11));
  pcie->add_option("--repetitions", pcie_args->repetitions, "Timed copies (best is reported)")
      ->check(CLI::Range(1, 1000));
  pcie->add_flag("--json", pcie_args->json, "Print one JSON object");
  pcie->callback([pcie_args] {
    auto device = make_cuda_device({});
    const PcieBenchResult r =
        run_pcie_bench(*device, static_cast<size_t>(pcie_args->bytes), pcie_args->repetitions);
    const std::string out = pcie_args->json ? r.to_json().dump() + "\n" : r.to_text(device->name());
    std::fputs(out.c_str(), stdout);
  });
}

}  // namespace tandem::cli
