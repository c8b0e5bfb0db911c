// `tandem bench adamw`: the CPU AdamW kernel's throughput next to the triad bandwidth
// measured in the same run with the same threads.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/core/cpu_features.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

struct AdamWBenchOptions {
  size_t params = 100'000'000;
  GradDType grad_dtype = GradDType::kF32;
  WorkingDType working_dtype = WorkingDType::kBF16;
  int threads = 0;  // 0: one per CPU
  SimdTarget target = best_simd_target();
  int repetitions = 5;  // timed passes of each (best taken), after one warm-up pass
};

struct AdamWBenchResult {
  AdamWBenchOptions options;
  int threads = 0;
  bool pinned = false;
  double bytes_per_param = 0;
  double adamw_seconds = 0;  // best pass
  double params_per_s = 0;
  double gb_per_s = 0;
  double triad_seconds = 0;   // best pass
  double triad_gb_per_s = 0;  // STREAM's count: 12 bytes per element
  // The same triad counting the write-allocate read of `a` (16 bytes per element): the
  // traffic DRAM really serves, since AdamW's in-place writes need no such extra read.
  double triad_gb_per_s_with_write_allocate = 0;
  double ratio = 0;  // gb_per_s / triad_gb_per_s

  nlohmann::json to_json() const;
  std::string to_text() const;
};

// Bytes one parameter's update reads and writes: p, g, m, v in; p, m, v and the
// 16-bit copy out.
double adamw_bytes_per_param(GradDType grad_dtype, WorkingDType working_dtype);

AdamWBenchResult run_adamw_bench(const AdamWBenchOptions& options);

}  // namespace tandem
