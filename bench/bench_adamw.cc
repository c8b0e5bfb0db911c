// Google Benchmark of the CPU AdamW kernel per SIMD target and thread count, with the
// STREAM-style triad measured in the same process for the ratio.
// Run: build/bench_adamw [--benchmark_filter=...]. `tandem bench adamw` is the same
// measurement as one command with a JSON output.
#include <benchmark/benchmark.h>

#include "tandem/bench/memory_bandwidth.h"
#include "tandem/core/cpu_features.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/adamw/adamw_reference.h"
#include "tandem/optim/adamw/cpu_adamw.h"

namespace tandem {
namespace {

constexpr size_t kParams = size_t{1} << 25;  // 32 M parameters, ~1 GB of state

void BM_AdamW(benchmark::State& state) {
  const auto target = static_cast<SimdTarget>(state.range(0));
  if (!cpu_supports(target)) {
    state.SkipWithError("this CPU lacks the SIMD target");
    return;
  }
  ThreadPool pool(static_cast<int>(state.range(1)));
  CpuAdamW kernel(pool, target);
  PooledArray params(pool, kParams, 1.0f), m(pool, kParams, 0.0f), v(pool, kParams, 0.0f);
  PooledArray grads(pool, kParams, 0.01f), working(pool, kParams / 2, 0.0f);
  const AdamWArrays arrays{.params = params.data(),
                           .m = m.data(),
                           .v = v.data(),
                           .grads = grads.data(),
                           .params16 = working.data(),
                           .params16_dtype = WorkingDType::kBF16};
  const AdamWStepScalars scalars =
      adamw_step_scalars(AdamWHyper{.lr = 1e-4f, .weight_decay = 0.01f}, 1, true, 1.0f);
  for (auto _ : state) kernel.update(arrays, kParams, scalars);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kParams * 30);
  state.counters["params_per_s"] = benchmark::Counter(
      static_cast<double>(kParams), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AdamW)
    ->ArgsProduct({{static_cast<int>(SimdTarget::kScalar), static_cast<int>(SimdTarget::kAvx2),
                    static_cast<int>(SimdTarget::kAvx512)},
                   {1, 2}})
    ->ArgNames({"target", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Triad(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  TriadBenchmark triad(pool, kParams);
  for (auto _ : state) triad.run_once();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * triad.bytes_per_pass()));
}
BENCHMARK(BM_Triad)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace tandem
