#include "tandem/bench/device_bench.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/timer.h"
#include "tandem/offload/perf_model.h"
#include "tandem/optim/adamw/adamw_device_kernel.h"
#include "tandem/optim/adamw/adamw_timing.h"

namespace tandem {
PcieBenchResult run_pcie_bench(Device& device, size_t bytes, int repetitions) {
  TANDEM_CHECK(bytes >= 1 && repetitions >= 1, "bench pcie needs bytes >= 1 and repetitions >= 1");
  DeviceAllocation host_a = device.allocate(MemorySpace::kPinnedHost, bytes);
  DeviceAllocation host_b = device.allocate(MemorySpace::kPinnedHost, bytes);
  DeviceAllocation dev_a = device.allocate(MemorySpace::kDevice, bytes);
  DeviceAllocation dev_b = device.allocate(MemorySpace::kDevice, bytes);
  auto up = device.create_stream("host-to-device");
  auto down = device.create_stream("device-to-host");
  PcieBenchResult r;
  r.bytes = bytes;
  r.h2d_gb_per_s = bytes / 1e9 / best_seconds(repetitions, [&] {
                     device.copy_async(dev_a.data(), host_a.data(), bytes, *up);
                     up->synchronize();
                   });
  r.d2h_gb_per_s = bytes / 1e9 / best_seconds(repetitions, [&] {
                     device.copy_async(host_b.data(), dev_b.data(), bytes, *down);
                     down->synchronize();
                   });
  r.both_gb_per_s = 2.0 * bytes / 1e9 / best_seconds(repetitions, [&] {
                      device.copy_async(dev_a.data(), host_a.data(), bytes, *up);
                      device.copy_async(host_b.data(), dev_b.data(), bytes, *down);
                      up->synchronize();
                      down->synchronize();
                    });
  return r;
}

nlohmann::json PcieBenchResult::to_json() const {
  nlohmann::json j = {{"bytes", bytes},
                      {"h2d_gb_per_s", h2d_gb_per_s},
                      {"d2h_gb_per_s", d2h_gb_per_s},
                      {"both_gb_per_s", both_gb_per_s}};
  if (peak_h2d_gb_per_s > 0 && peak_d2h_gb_per_s > 0) {
    j["peak_h2d_gb_per_s"] = peak_h2d_gb_per_s;
    j["peak_d2h_gb_per_s"] = peak_d2h_gb_per_s;
    j["h2d_ratio"] = h2d_gb_per_s / peak_h2d_gb_per_s;
    j["d2h_ratio"] = d2h_gb_per_s / peak_d2h_gb_per_s;
  }
  return j;
}

std::string PcieBenchResult::to_text(std::string_view device) const {
  std::string text =
      cat("tandem bench pcie on ", device, ": ", bytes, " bytes per copy, pinned host memory\n",
          "  host-to-device: ", h2d_gb_per_s, " GB/s\n", "  device-to-host: ", d2h_gb_per_s,
          " GB/s\n", "  both at once:   ", both_gb_per_s, " GB/s in total\n");
  if (peak_h2d_gb_per_s > 0 && peak_d2h_gb_per_s > 0)
    text +=
        cat("  plain cudaMemcpyAsync, best: ", peak_h2d_gb_per_s, " GB/s host-to-device (ratio ",
            h2d_gb_per_s / peak_h2d_gb_per_s, "), ", peak_d2h_gb_per_s,
            " GB/s device-to-host (ratio ", d2h_gb_per_s / peak_d2h_gb_per_s, ")\n");
  return text;
}

DeviceAdamWBenchResult run_device_adamw_bench(Device& device, size_t params, int repetitions) {
  TANDEM_CHECK(params >= 1 && repetitions >= 1, "bench adamw needs params >= 1");
  const size_t n = params;
  DeviceAllocation state = device.allocate(MemorySpace::kDevice, 4 * n * sizeof(float));
  DeviceAllocation working = device.allocate(MemorySpace::kDevice, n * 2);
  auto stream = device.create_stream("bench");
  float* base = state.as<float>();
  AdamWArrays arrays = fill_adamw_timing_state(device, *stream, base, n);
  arrays.params16 = working.data();
  arrays.params16_dtype = WorkingDType::kBF16;
  AdamWHyper hyper;
  hyper.lr = 1e-4f;
  hyper.weight_decay = 0.01f;
  const AdamWStepScalars scalars = adamw_step_scalars(hyper, 1, true, 1.0f);
  DeviceAdamWBenchResult r;
  r.params = n;
  r.bytes_per_param = 30;
  const double adamw = best_seconds(repetitions, [&] {
    device.launch_async(adamw_device_kernel(arrays, n, scalars), *stream);
    stream->synchronize();
  });
  // A plain copy of half the state onto the other half (8 bytes per parameter read and
  // written): the bandwidth a streaming kernel can hope for, on the same buffers.
  const size_t copy_bytes = n * 2 * sizeof(float);
  const double copy = best_seconds(repetitions, [&] {
    device.copy_async(reinterpret_cast<char*>(base) + copy_bytes, base, copy_bytes, *stream);
    stream->synchronize();
  });
  r.params_per_s = n / adamw;
  r.gb_per_s = r.params_per_s * r.bytes_per_param / 1e9;
  r.copy_gb_per_s = 2.0 * copy_bytes / copy / 1e9;
  r.ratio = r.gb_per_s / r.copy_gb_per_s;
  return r;
}

nlohmann::json DeviceAdamWBenchResult::to_json() const {
  return {
      {"params", params},     {"bytes_per_param", bytes_per_param}, {"params_per_s", params_per_s},
      {"gb_per_s", gb_per_s}, {"copy_gb_per_s", copy_gb_per_s},     {"ratio", ratio}};
}

std::string DeviceAdamWBenchResult::to_text(std::string_view device) const {
  return cat(
      "tandem bench adamw on ", device, ": ", params,
      " params, fp32 gradients, bf16 working copy\n", "  bytes per parameter: ", bytes_per_param,
      " (read p, g, m, v: 16; write p, m, v: 12; write bf16 copy: 2)\n",
      "  adamw: ", params_per_s / 1e9, " G params/s, ", gb_per_s, " GB/s\n",
      "  device-to-device copy: ", copy_gb_per_s, " GB/s (read + write, same buffers, same run)\n",
      "  ratio: ", ratio, " of the copy bandwidth\n");
}

}  // namespace tandem
