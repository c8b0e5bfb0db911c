// A fixed set of worker threads, each pinned to its own core, that run one task at a
// time on all workers (a parallel region). Memory-bound kernels such as the CPU
// optimizer want exactly this: every thread streams its own contiguous range, stays on
// one core (and so near its memory and caches), and the split is the same every call.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  // threads <= 0: one per CPU this process may run on. With pin, worker i is bound to
  // the i-th of those CPUs (wrapping around when there are more workers than CPUs).
  explicit ThreadPool(int threads = 0, bool pin = true);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }
  // Whether every worker was successfully pinned.
  bool pinned() const { return pinned_; }

  // Runs fn(worker_index) once on every worker and returns when all are done. If any
  // call throws, the first exception is rethrown here (after all workers finished).
  void run(const std::function<void(int worker)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  bool pinned_ = true;
  std::exception_ptr error_;
};

// The i-th of `parts` contiguous pieces of [0, n), with piece boundaries on multiples
// of `align` elements (so SIMD loops and cache lines are not split between threads).
struct Range {
  size_t begin, end;
};
Range split_range(size_t n, int parts, int index, size_t align = 16);

// The CPUs this process may run on (sched_getaffinity), in increasing order.
std::vector<int> allowed_cpus();

}  // namespace tandem
