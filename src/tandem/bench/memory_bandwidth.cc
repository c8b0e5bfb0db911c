#include "tandem/bench/memory_bandwidth.h"

#include <cstdlib>

#include "tandem/core/error.h"
#include "tandem/core/timer.h"

namespace tandem {
namespace {

// Compiled for AVX2 where the CPU has it, so the triad is limited by memory and not
// by the baseline SSE2 code path.
__attribute__((target_clones("avx2", "default"))) void triad(float* a, const float* b,
                                                             const float* c, float s, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

}  // namespace

void PooledArray::Free::operator()(float* p) const { std::free(p); }

PooledArray::PooledArray(ThreadPool& pool, size_t n, float value) : n_(n) {
  const size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
  data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes)));
  TANDEM_CHECK(data_ != nullptr, "out of host memory allocating ", bytes, " bytes");
  float* data = data_.get();
  pool.run([&](int worker) {
    const Range r = split_range(n, pool.size(), worker, 64);
    for (size_t i = r.begin; i < r.end; i++) data[i] = value;
  });
}

TriadBenchmark::TriadBenchmark(ThreadPool& pool, size_t n)
    : pool_(pool), a_(pool, n, 0.0f), b_(pool, n, 1.0f), c_(pool, n, 2.0f) {}

double TriadBenchmark::run_once() {
  float* a = a_.data();
  const float* b = b_.data();
  const float* c = c_.data();
  const size_t n = a_.size();
  Stopwatch watch;
  pool_.run([&](int worker) {
    const Range r = split_range(n, pool_.size(), worker, 64);
    triad(a + r.begin, b + r.begin, c + r.begin, 3.0f, r.end - r.begin);
  });
  return watch.seconds();
}

}  // namespace tandem
