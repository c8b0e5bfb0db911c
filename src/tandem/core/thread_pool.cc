#include "tandem/core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace tandem {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  if (cpus.empty()) {
    const unsigned n = std::thread::hardware_concurrency();
    for (unsigned cpu = 0; cpu < (n == 0 ? 1 : n); cpu++) cpus.push_back(static_cast<int>(cpu));
  }
  return cpus;
}

Range split_range(size_t n, int parts, int index, size_t align) {
  const size_t blocks = (n + align - 1) / align;
  const size_t per = blocks / parts, extra = blocks % parts;
  const size_t i = static_cast<size_t>(index);
  const size_t first_block = i * per + (i < extra ? i : extra);
  const size_t block_count = per + (i < extra ? 1 : 0);
  const size_t begin = std::min(n, first_block * align);
  const size_t end = std::min(n, (first_block + block_count) * align);
  return {begin, end};
}

ThreadPool::ThreadPool(int threads, bool pin) {
  const std::vector<int> cpus = allowed_cpus();
  if (threads <= 0) threads = static_cast<int>(cpus.size());
  pinned_ = pin;
  workers_.reserve(threads);
  for (int i = 0; i < threads; i++) {
    workers_.emplace_back([this, i] { worker_loop(i); });
    if (pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[i % cpus.size()], &set);
      // Pinning is an optimisation: a container may forbid it, and that is not an error.
      if (pthread_setaffinity_np(workers_.back().native_handle(), sizeof(set), &set) != 0)
        pinned_ = false;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  std::unique_lock<std::mutex> lock(mutex_);
  task_ = &fn;
  running_ = size();
  error_ = nullptr;
  generation_++;
  start_.notify_all();
  done_.wait(lock, [this] { return running_ == 0; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      task = task_;
    }
    std::exception_ptr error;
    try {
      (*task)(index);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (error && !error_) error_ = error;
    if (--running_ == 0) done_.notify_one();
  }
}

}  // namespace tandem
