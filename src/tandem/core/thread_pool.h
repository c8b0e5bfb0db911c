// A fixed set of worker threads that, together with the calling thread, share the work
// of one parallel loop at a time.
//
// Why not OpenMP's static loops and barriers: a training job shares its machine (data
// loaders, monitoring, other jobs). A static split waits at the end of every loop for
// the thread whose core was taken, and OpenMP's barrier then spins on the cores the
// others need; a step of a few hundred loops went 3-10x slower beside a busy loop on
// one of two cores (bench/README.md, "Speed with a neighbour"). Here the loop's items
// are split into one contiguous part per participant; each takes items from the front
// of its own part (so on a quiet machine every thread streams its own range, as a
// static split would) and, once that is empty, takes the remaining items of the others.
// The loop is done when every item is done, not when every thread has arrived: a worker
// that was not scheduled in time finds nothing left and costs nothing.
//
// Which thread runs an item never changes what the item computes, so code whose items
// are independent gives the same bits for any thread count and any interleaving.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  // Runnable threads of other programs on this machine now; < 0 when it cannot be told.
  using LoadProbe = std::function<long()>;

  // `threads` participants: the calling thread and threads - 1 workers; <= 0: one per
  // CPU this process may run on (OMP_NUM_THREADS where set, as the CPU kernels have
  // always honoured it). With `pin`, worker i is bound to the (i+1)-th allowed CPU, but
  // only while there are at least as many allowed CPUs as participants and other programs
  // leave them free: a pinned thread cannot move off a core another program takes. The
  // pool looks when it starts and again, at most every `recheck`, when a loop starts, and
  // unbinds its workers while others would need their cores (binds them again once the
  // others are gone). `others_runnable`: how it looks (others_runnable_threads; tests
  // give their own).
  explicit ThreadPool(int threads = 0, bool pin = true);
  ThreadPool(int threads, bool pin, LoadProbe others_runnable,
             std::chrono::milliseconds recheck = std::chrono::milliseconds(1000));
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Participants, the caller included.
  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Whether every worker is bound to a core of its own now.
  bool pinned() const { return pinned_.load(std::memory_order_relaxed); }

  // Calls fn(begin, end) on consecutive chunks covering [0, n), each a multiple of
  // `min_chunk` indices (the last may be shorter), on any of the participants; returns
  // when all are done. At most 8 chunks per participant: enough for the others to take
  // over most of a thread that lost its core, few enough to keep the cost of claiming
  // small. If a chunk throws, the chunks not yet started are skipped and the first
  // exception is rethrown here. A call made from inside one of this pool's chunks runs
  // serially on the calling thread.
  void parallel_for(size_t n, size_t min_chunk,
                    const std::function<void(size_t begin, size_t end)>& fn);

  // fn(part) once for every part in [0, size()): for code that splits its own range
  // (split_range). Participant p runs part p when it is free to, others take it over
  // otherwise, so this too never waits for a descheduled thread to start.
  void run(const std::function<void(int part)>& fn);

 private:
  struct Part;
  struct Job;

  // Claims and runs items of the current job until none is left anywhere.
  void work_on_current_job(int participant);
  void worker_loop(int participant);
  void run_items(size_t items, const std::function<void(size_t item)>& fn);
  // Binds or unbinds the workers as the other programs' load allows, if `recheck` has
  // passed since the last look (the submitter's, under submit_mutex_).
  void follow_load(bool now);
  bool bind_workers(bool pin);

  std::vector<std::thread> workers_;
  std::unique_ptr<Part[]> parts_;  // one per participant, on cache lines of their own
  std::unique_ptr<Job> job_;
  std::mutex submit_mutex_;  // one job at a time when several threads share the pool

  // Workers that found nothing to do spin briefly for the next job, then sleep here.
  std::atomic<uint64_t> jobs_started_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stopping_{false};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;

  // Pinning (follow_load).
  std::vector<int> cpus_;  // allowed_cpus() when the pool started
  bool pin_ = false;       // asked for, and possible: participants <= CPUs
  LoadProbe others_runnable_;
  std::chrono::milliseconds recheck_{1000};
  std::chrono::steady_clock::time_point next_look_;
  std::atomic<bool> pinned_{false};
};

// Runnable threads of programs other than this one, now: /proc/loadavg's count of the
// machine's runnable threads less this process's (/proc/self/task/*/stat in state R);
// -1 where /proc cannot be read.
long others_runnable_threads();

// The i-th of `parts` contiguous pieces of [0, n), with piece boundaries on multiples
// of `align` elements (so SIMD loops and cache lines are not split between threads).
struct Range {
  size_t begin, end;
};
Range split_range(size_t n, int parts, int index, size_t align = 16);

// The CPUs this process may run on (sched_getaffinity), in increasing order.
std::vector<int> allowed_cpus();

// Threads a pool of `ThreadPool(0)` has: OMP_NUM_THREADS where it is a positive number,
// else the allowed CPUs.
int default_thread_count();

}  // namespace tandem
