// The machine's reference figure for pinned copies: cudaMemcpyAsync called directly,
// without tandem's device layer, so `tandem bench pcie` can report how close tandem's
// copies come to it (the goal: at least 85%).
#pragma once

#include <cstddef>

#include "tandem/device/device.h"

namespace tandem {

struct MemcpyPeak {
  double h2d_gb_per_s = 0;  // pinned host -> device
  double d2h_gb_per_s = 0;  // device -> pinned host
};

// Best of `repetitions` copies of `bytes` each way on a `cuda` device, between its
// pinned host and device memory, each a plain cudaMemcpyAsync timed with CUDA events.
// Throws tandem::Error when tandem was built without CUDA or `device` is not a GPU.
MemcpyPeak measure_memcpy_peak(Device& device, size_t bytes, int repetitions);

}  // namespace tandem
