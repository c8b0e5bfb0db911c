// Benchmarks of a device (`tandem bench pcie`, `tandem bench adamw --device cuda`),
// written against the device layer so they run on any backend.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/device/device.h"

namespace tandem {

struct PcieBenchResult {
  size_t bytes = 0;
  double h2d_gb_per_s = 0;   // pinned host -> device
  double d2h_gb_per_s = 0;   // device -> pinned host
  double both_gb_per_s = 0;  // both directions at once, total bytes moved per second
  // The machine's best cudaMemcpyAsync figures, same sizes, same run (0: not measured,
  // e.g. on the cpu device); the goal is h2d and d2h at >= 85% of them.
  double peak_h2d_gb_per_s = 0;
  double peak_d2h_gb_per_s = 0;
  nlohmann::json to_json() const;
  std::string to_text(std::string_view device) const;
};

// Best of `repetitions` copies of `bytes` each way, and both ways at once on two streams.
PcieBenchResult run_pcie_bench(Device& device, size_t bytes, int repetitions);

struct DeviceAdamWBenchResult {
  size_t params = 0;
  double bytes_per_param = 0;
  double params_per_s = 0;
  double gb_per_s = 0;
  double copy_gb_per_s = 0;  // device-to-device copy, read + write bytes, same run
  double ratio = 0;          // gb_per_s / copy_gb_per_s
  nlohmann::json to_json() const;
  std::string to_text(std::string_view device) const;
};

// The device AdamW (fp32 gradients, bf16 working copy: 30 bytes per parameter) next to
// a device-to-device copy over the same buffers measured in the same run.
DeviceAdamWBenchResult run_device_adamw_bench(Device& device, size_t params, int repetitions);

}  // namespace tandem
