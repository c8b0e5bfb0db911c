#include "tandem/bench/adamw_bench.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "tandem/bench/memory_bandwidth.h"
#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/core/timer.h"
#include "tandem/optim/adamw/cpu_adamw.h"

namespace tandem {
namespace {

// The tables' names are string literals, so their data() ends in a NUL (printf's %s).
const char* grad_name(GradDType d) { return enum_name(kGradDTypeNames, d).data(); }
const char* working_name(WorkingDType d) { return enum_name(kWorkingDTypeNames, d).data(); }

}  // namespace

double adamw_bytes_per_param(GradDType grad_dtype, WorkingDType working_dtype) {
  const double grad = grad_dtype == GradDType::kF32 ? 4 : 2;
  const double working = working_dtype == WorkingDType::kNone ? 0 : 2;
  return 4 + grad + 4 + 4 + 4 + 4 + 4 + working;
}

AdamWBenchResult run_adamw_bench(const AdamWBenchOptions& options) {
  TANDEM_CHECK(options.params >= 1, "--params must be at least 1");
  TANDEM_CHECK(options.repetitions >= 1, "repetitions must be at least 1");
  ThreadPool pool(options.threads);
  CpuAdamW kernel(pool, options.target);
  const size_t n = options.params;

  // Gradients are stored as floats or bf16 in the same allocation.
  PooledArray params(pool, n, 1.0f), m(pool, n, 0.0f), v(pool, n, 0.0f);
  PooledArray grads(pool, options.grad_dtype == GradDType::kF32 ? n : (n + 1) / 2, 0.0f);
  PooledArray working(pool, options.working_dtype == WorkingDType::kNone ? 0 : (n + 1) / 2, 0.0f);
  // bf16 0x3c23 = 0.00994873; as a float pair 0x3c233c23 = 0.00996...: both a small gradient.
  {
    uint32_t* bits = reinterpret_cast<uint32_t*>(grads.data());
    const uint32_t pattern = options.grad_dtype == GradDType::kF32 ? 0x3c23d70au : 0x3c233c23u;
    pool.run([&](int worker) {
      const Range r = split_range(grads.size(), pool.size(), worker, 64);
      for (size_t i = r.begin; i < r.end; i++) bits[i] = pattern;
    });
  }
  const AdamWArrays arrays{.params = params.data(),
                           .m = m.data(),
                           .v = v.data(),
                           .grads = grads.data(),
                           .grad_dtype = options.grad_dtype,
                           .params16 = working.size() ? working.data() : nullptr,
                           .params16_dtype = options.working_dtype};
  TriadBenchmark triad(pool, n);

  AdamWBenchResult result;
  result.options = options;
  result.threads = pool.size();
  result.pinned = pool.pinned();
  result.bytes_per_param = adamw_bytes_per_param(options.grad_dtype, options.working_dtype);
  result.adamw_seconds = result.triad_seconds = std::numeric_limits<double>::infinity();
  const AdamWHyper hyper{.lr = 1e-4f, .weight_decay = 0.01f};
  // Interleaved, so that both see the same machine load; the first pass of each warms up.
  for (int pass = 0; pass <= options.repetitions; pass++) {
    const double t_triad = triad.run_once();
    Stopwatch watch;
    kernel.update(arrays, n, adamw_step_scalars(hyper, pass + 1, true, 1.0f));
    const double t_adamw = watch.seconds();
    if (pass == 0) continue;
    result.triad_seconds = std::min(result.triad_seconds, t_triad);
    result.adamw_seconds = std::min(result.adamw_seconds, t_adamw);
  }
  result.params_per_s = n / result.adamw_seconds;
  result.gb_per_s = result.params_per_s * result.bytes_per_param / 1e9;
  result.triad_gb_per_s = triad.bytes_per_pass() / result.triad_seconds / 1e9;
  result.triad_gb_per_s_with_write_allocate = result.triad_gb_per_s * 16.0 / 12.0;
  result.ratio = result.gb_per_s / result.triad_gb_per_s;
  return result;
}

nlohmann::json AdamWBenchResult::to_json() const {
  return {{"params_per_s", params_per_s},
          {"gb_per_s", gb_per_s},
          {"triad_gb_per_s", triad_gb_per_s},
          {"ratio", ratio},
          {"triad_gb_per_s_with_write_allocate", triad_gb_per_s_with_write_allocate},
          {"params", options.params},
          {"bytes_per_param", bytes_per_param},
          {"grad_dtype", grad_name(options.grad_dtype)},
          {"param_dtype", working_name(options.working_dtype)},
          {"threads", threads},
          {"pinned", pinned},
          {"target", std::string(simd_target_name(options.target))},
          {"repetitions", options.repetitions},
          {"adamw_seconds", adamw_seconds},
          {"triad_seconds", triad_seconds}};
}

std::string AdamWBenchResult::to_text() const {
  char text[1024];
  std::snprintf(
      text, sizeof text,
      "tandem bench adamw: %zu params, %s gradients, %s working copy, %d threads%s, %s kernel\n"
      "  bytes per parameter: %.0f (read p, m, v: 12 and the gradient: %s; write p, m, v: 12%s)\n"
      "  adamw: %.3f G params/s, %.2f GB/s (best of %d passes: %.1f ms)\n"
      "  triad: %.2f GB/s (a = b + s*c, 12 bytes per element, same threads, best of %d: %.1f ms)\n"
      "  ratio: %.3f of the triad bandwidth (%.3f of the triad counting its write-allocate "
      "reads, %.2f GB/s)\n",
      options.params, grad_name(options.grad_dtype), working_name(options.working_dtype), threads,
      pinned ? " (pinned)" : " (not pinned)", std::string(simd_target_name(options.target)).c_str(),
      bytes_per_param, options.grad_dtype == GradDType::kF32 ? "4" : "2",
      options.working_dtype == WorkingDType::kNone ? "" : "; write the 16-bit copy: 2",
      params_per_s / 1e9, gb_per_s, options.repetitions, adamw_seconds * 1e3, triad_gb_per_s,
      options.repetitions, triad_seconds * 1e3, ratio,
      gb_per_s / triad_gb_per_s_with_write_allocate, triad_gb_per_s_with_write_allocate);
  return text;
}

}  // namespace tandem
