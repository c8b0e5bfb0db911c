// `tandem bench demo`: how fast a DeMo step runs on the CPU, next to OpenBLAS sgemm measured
// in the same process with the same threads (the DCT is dense float arithmetic, so sgemm is
// what it can be held to); and, where there is a GPU, the same step by the CUDA kernels
// (demo_cuda.h) in the same run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tandem/core/cpu_features.h"
#include "tandem/optim/demo/demo.h"

namespace tandem {

struct DemoBenchOptions {
  // The 2-D and 1-D tensors of one GPT-2 small layer (768 wide): c_attn, c_proj, c_fc,
  // mlp c_proj and their biases, ln weights.
  std::vector<std::vector<int64_t>> shapes = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072},
                                              {2304},      {768},      {3072},      {768}};
  int threads = 0;  // 0: one per CPU
  SimdTarget target = best_simd_target();
  int repetitions = 3;  // timed passes of each (best taken), after a warm-up
  DemoHyper hyper;
};

struct DemoBenchResult {
  DemoBenchOptions options;
  int threads = 0;
  int64_t params = 0;
  double step_seconds = 0;  // a one-rank DeMo step of every tensor (best pass)
  double params_per_s = 0;
  double dct_seconds = 0;  // the forward DCT of every block (best pass)
  double dct_gflop = 0;    // its floating-point operations (an fma is 2)
  double dct_gflop_per_s = 0;
  double sgemm_gflop_per_s = 0;  // OpenBLAS, n = 1024, the same threads
  double ratio = 0;              // dct_gflop_per_s / sgemm_gflop_per_s
  // The GPU (empty device: none, gpu_unavailable says why): a one-rank step of every tensor
  // by the CUDA kernels, compress and apply, data in device memory (best pass).
  std::string gpu_device, gpu_unavailable;
  double gpu_step_seconds = 0;
  double gpu_params_per_s = 0;

  nlohmann::json to_json() const;
  std::string to_text() const;
};

DemoBenchResult run_demo_bench(const DemoBenchOptions& options);

}  // namespace tandem
