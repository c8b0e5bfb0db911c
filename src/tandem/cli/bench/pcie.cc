// `tandem bench pcie`: pinned copy bandwidth between host and GPU (bench/device_bench.h),
// with the peak a plain memcpy reaches (bench/cuda/memcpy_peak.h).
#include <cstddef>
#include <memory>

#include "tandem/bench/cuda/memcpy_peak.h"
#include "tandem/bench/device_bench.h"
#include "tandem/cli/bench/bench_commands.h"
#include "tandem/device/cuda/cuda_device.h"

namespace tandem::cli {

void register_bench_pcie(CLI::App& bench) {
  struct Args {
    double bytes = 256.0 * (1 << 20);
    int repetitions = 5;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "pcie", "Pinned host-to-device, device-to-host and both-at-once copy bandwidth (GPU)");
  cmd->add_option("--bytes", args->bytes, "Bytes per copy")->check(CLI::Range(1.0, 1e11));
  cmd->add_option("--repetitions", args->repetitions, "Timed copies (best is reported)")
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] {
    auto device = make_cuda_device({});
    const auto bytes = static_cast<size_t>(args->bytes);
    PcieBenchResult r = run_pcie_bench(*device, bytes, args->repetitions);
    const MemcpyPeak peak = measure_memcpy_peak(*device, bytes, args->repetitions);
    r.peak_h2d_gb_per_s = peak.h2d_gb_per_s;
    r.peak_d2h_gb_per_s = peak.d2h_gb_per_s;
    print_result(r, args->json, device->name());
  });
}

}  // namespace tandem::cli
