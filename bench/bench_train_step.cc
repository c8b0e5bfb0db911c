// Google Benchmarks of the CPU training step and its parts, at the size of the
// shakespeare-char demo model (4 layers, C=128, 4 heads, T=128, B=16, V=256).
// Run: build/bench_train_step [--benchmark_filter=...]
// The scalar AdamW reference reports bytes/s (28 bytes per parameter: read p, g, m, v,
// write p, m, v) to compare with the machine's memory bandwidth; the fast kernel
// and the STREAM-style comparison come with `tandem bench adamw` (issue 3).
#include <benchmark/benchmark.h>

#include <vector>

#include "tandem/compute/compute_backend.h"
#include "tandem/core/rng.h"
#include "tandem/model/gpt.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {
namespace {

const ModelConfig kDemoModel{
    .vocab_size = 256, .context_length = 128, .n_layer = 4, .n_head = 4, .n_embd = 128};
constexpr int kBatch = 16, kSeq = 128;

std::vector<int32_t> random_tokens(size_t n, int vocab) {
  Rng rng(1);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.next_u64() % vocab);
  return tokens;
}

void BM_ForwardBackward(benchmark::State& state) {
  auto backend = make_cpu_backend();
  Gpt model(kDemoModel, *backend, kBatch, kSeq);
  model.init_weights(1);
  const auto tokens = random_tokens(kBatch * kSeq, kDemoModel.vocab_size);
  const auto targets = random_tokens(kBatch * kSeq, kDemoModel.vocab_size);
  for (auto _ : state) {
    model.zero_grads();
    benchmark::DoNotOptimize(model.forward(tokens.data(), targets.data(), kBatch, kSeq));
    model.backward();
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(kBatch) * kSeq, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Forward(benchmark::State& state) {
  auto backend = make_cpu_backend();
  Gpt model(kDemoModel, *backend, kBatch, kSeq);
  model.init_weights(1);
  const auto tokens = random_tokens(kBatch * kSeq, kDemoModel.vocab_size);
  const auto targets = random_tokens(kBatch * kSeq, kDemoModel.vocab_size);
  for (auto _ : state)
    benchmark::DoNotOptimize(model.forward(tokens.data(), targets.data(), kBatch, kSeq));
}
BENCHMARK(BM_Forward)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AdamWReference(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
  const AdamWStepScalars s = adamw_step_scalars(AdamWHyper{.weight_decay = 0.1f}, 1, true, 1.0f);
  for (auto _ : state) {
    adamw_reference(p.data(), g.data(), m.data(), v.data(), n, s);
    benchmark::ClobberMemory();
  }
  state.counters["params_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) * 28);
}
BENCHMARK(BM_AdamWReference)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tandem
