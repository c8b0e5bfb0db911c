// A STREAM-style triad (a[i] = b[i] + s * c[i]) on a thread pool: the host memory
// bandwidth that memory-bound kernels are measured against, taken in the same process
// with the same threads, because these machines are shared and their bandwidth varies.
#pragma once

#include <cstddef>
#include <memory>

#include "tandem/core/thread_pool.h"

namespace tandem {

// A 64-byte aligned float array whose pages are first touched by the pool's threads,
// each in its own range (so on a NUMA machine they live near the thread that uses them).
class PooledArray {
 public:
  PooledArray(ThreadPool& pool, size_t n, float value);
  float* data() { return data_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], Free> data_;
  size_t n_;
};

class TriadBenchmark {
 public:
  TriadBenchmark(ThreadPool& pool, size_t n);
  // One pass over the arrays; returns seconds.
  double run_once();
  // STREAM's convention: 12 bytes per element (read b and c, write a).
  double bytes_per_pass() const { return 12.0 * a_.size(); }

 private:
  ThreadPool& pool_;
  PooledArray a_, b_, c_;
};

}  // namespace tandem
