#include "tandem/core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// A polling loop's pause: lets the core's other hardware thread run and saves power.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long a worker that finished its items keeps polling for the next loop before it
// sleeps. Consecutive kernels of a training step follow each other within microseconds,
// and waking a sleeping thread takes tens of them; but every microsecond spun is taken
// from whoever else wants the core. libgomp spins about 300,000 polls (milliseconds).
constexpr auto kWorkerSpin = std::chrono::microseconds(100);
// How long the caller polls for the last items of its loop before it yields its core
// between polls (a thread that holds one was descheduled: let it run).
constexpr auto kCallerSpin = std::chrono::microseconds(20);

// The pool whose chunk this thread is running, to run a nested loop serially.
thread_local const ThreadPool* running_pool = nullptr;

class RunningGuard {
 public:
  explicit RunningGuard(const ThreadPool* pool) : previous_(running_pool) { running_pool = pool; }
  ~RunningGuard() { running_pool = previous_; }
  RunningGuard(const RunningGuard&) = delete;
  RunningGuard& operator=(const RunningGuard&) = delete;

 private:
  const ThreadPool* previous_;
};

// A part's cursor is (end << 32 | next): one word, so that a claim (next < end, then
// next + 1) is a single compare-and-swap that cannot succeed on a part the submitter
// has meanwhile reset for another loop unless that loop really has the item unclaimed.
constexpr uint64_t cursor(uint64_t next, uint64_t end) { return end << 32 | next; }
constexpr uint64_t cursor_next(uint64_t c) { return c & 0xffffffffu; }
constexpr uint64_t cursor_end(uint64_t c) { return c >> 32; }

// Whether the others' runnable threads would take cores the pool's workers are bound to:
// more of them than the CPUs the pool leaves free.
bool others_need_the_cores(long others, int cpus, int participants) {
  return others > cpus - participants;
}

// The state field of a /proc/<pid>/task/<tid>/stat line: after the command's closing
// parenthesis (a command may hold spaces and parentheses itself).
char task_state(const std::string& stat) {
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

}  // namespace

struct alignas(64) ThreadPool::Part {
  std::atomic<uint64_t> cursor{0};
};

struct ThreadPool::Job {
  // Set by the submitter before the parts are, read by a claimer after its claim: a
  // claimed item always belongs to the loop these describe.
  std::atomic<const std::function<void(size_t)>*> fn{nullptr};
  std::atomic<size_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
};

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

int default_thread_count() {
  if (const char* value = std::getenv("OMP_NUM_THREADS")) {
    // The first entry of OpenMP's list form ("4,2" is 4 at the outermost level).
    const int threads = std::atoi(value);
    if (threads > 0) return threads;
  }
  return static_cast<int>(allowed_cpus().size());
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

long others_runnable_threads() {
  std::FILE* file = std::fopen("/proc/loadavg", "r");
  if (file == nullptr) return -1;
  double one, five, fifteen;
  long runnable = 0, total = 0;
  const int fields =
      std::fscanf(file, "%lf %lf %lf %ld/%ld", &one, &five, &fifteen, &runnable, &total);
  std::fclose(file);
  if (fields != 5) return -1;
  long own = 0;
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    if (std::getline(stat, line) && task_state(line) == 'R') own++;
  }
  if (error) return -1;
  return std::max(0L, runnable - own);
}

ThreadPool::ThreadPool(int threads, bool pin) : ThreadPool(threads, pin, others_runnable_threads) {}

ThreadPool::ThreadPool(int threads, bool pin, LoadProbe others_runnable,
                       std::chrono::milliseconds recheck)
    : job_(std::make_unique<Job>()),
      cpus_(allowed_cpus()),
      others_runnable_(std::move(others_runnable)),
      recheck_(recheck) {
  if (threads <= 0) threads = default_thread_count();
  parts_ = std::make_unique<Part[]>(threads);
  pin_ = pin && threads > 1 && threads <= static_cast<int>(cpus_.size());
  workers_.reserve(threads - 1);
  for (int participant = 1; participant < threads; participant++)
    workers_.emplace_back([this, participant] { worker_loop(participant); });
  follow_load(true);
}

bool ThreadPool::bind_workers(bool pin) {
  for (size_t w = 0; w < workers_.size(); w++) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (pin) {
      CPU_SET(cpus_[w + 1], &set);  // the caller keeps the first
    } else {
      for (int cpu : cpus_) CPU_SET(cpu, &set);
    }
    // Pinning is an optimisation: a container may forbid it, and that is not an error.
    if (pthread_setaffinity_np(workers_[w].native_handle(), sizeof(set), &set) != 0) return false;
  }
  return true;
}

void ThreadPool::follow_load(bool now) {
  if (!pin_) return;
  const Clock::time_point time = Clock::now();
  if (!now && time < next_look_) return;
  next_look_ = time + recheck_;
  // At the start, the fewest of three looks a millisecond apart, so that a moment's work
  // elsewhere does not count; later one look, and the next one corrects a wrong call.
  long others = others_runnable_();
  for (int look = 1; now && look < 3 && others > 0; look++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    others = std::min(others, others_runnable_());
  }
  const bool want =
      others >= 0 && !others_need_the_cores(others, static_cast<int>(cpus_.size()), size());
  if (want == pinned_.load(std::memory_order_relaxed)) return;
  if (want) {
    const bool bound = bind_workers(true);
    if (!bound) {
      bind_workers(false);
      pin_ = false;  // not allowed here: never try again
    }
    pinned_.store(bound, std::memory_order_relaxed);
  } else {
    bind_workers(false);
    pinned_.store(false, std::memory_order_relaxed);
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stopping_.store(true);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::parallel_for(size_t n, size_t min_chunk,
                              const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  // A multiple of min_chunk, so that chunk boundaries fall where the caller allows them.
  min_chunk = std::max(min_chunk, size_t{1});
  const size_t most_chunks = static_cast<size_t>(size()) * 8;
  const size_t chunk = (std::max(min_chunk, (n + most_chunks - 1) / most_chunks) + min_chunk - 1) /
                       min_chunk * min_chunk;
  // One reference captured, so the item function fits std::function's inline storage: a
  // step makes hundreds of these calls, and none of them allocates.
  const struct {
    size_t n, chunk;
    const std::function<void(size_t, size_t)>& fn;
  } loop{n, chunk, fn};
  run_items((n + chunk - 1) / chunk,
            [&loop](size_t c) { loop.fn(c * loop.chunk, std::min(loop.n, (c + 1) * loop.chunk)); });
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  run_items(static_cast<size_t>(size()), [&](size_t part) { fn(static_cast<int>(part)); });
}

void ThreadPool::run_items(size_t items, const std::function<void(size_t)>& fn) {
  if (items == 0) return;
  if (workers_.empty() || running_pool == this) {
    RunningGuard running(this);
    for (size_t item = 0; item < items; item++) fn(item);
    return;
  }
  std::lock_guard<std::mutex> one_job_at_a_time(submit_mutex_);
  follow_load(false);
  Job& job = *job_;
  job.fn.store(&fn, std::memory_order_relaxed);
  job.done.store(0, std::memory_order_relaxed);
  job.failed.store(false, std::memory_order_relaxed);
  job.error = nullptr;
  const int participants = size();
  for (int p = 0; p < participants; p++) {
    const Range part = split_range(items, participants, p, 1);
    parts_[p].cursor.store(cursor(part.begin, part.end), std::memory_order_release);
  }
  // Sequentially consistent with the sleepers' count, so that a worker either sees this
  // job before it sleeps or is counted here and woken.
  jobs_started_.fetch_add(1);
  if (sleepers_.load() > 0) {
    { std::lock_guard<std::mutex> lock(sleep_mutex_); }
    wake_.notify_all();
  }
  work_on_current_job(0);
  const Clock::time_point start = Clock::now();
  while (job.done.load(std::memory_order_acquire) != items) {
    if (Clock::now() - start < kCallerSpin) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  if (job.error) std::rethrow_exception(job.error);
}

void ThreadPool::work_on_current_job(int participant) {
  RunningGuard running(this);
  Job& job = *job_;
  const int participants = size();
  // Its own part first, then the others' in turn.
  for (int k = 0; k < participants; k++) {
    Part& part = parts_[(participant + k) % participants];
    uint64_t c = part.cursor.load(std::memory_order_acquire);
    while (cursor_next(c) < cursor_end(c)) {
      if (!part.cursor.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                             std::memory_order_acquire))
        continue;
      const std::function<void(size_t)>& fn = *job.fn.load(std::memory_order_relaxed);
      if (!job.failed.load(std::memory_order_relaxed)) {
        try {
          fn(cursor_next(c));
        } catch (...) {
          std::lock_guard<std::mutex> lock(job.error_mutex);
          if (!job.error) job.error = std::current_exception();
          job.failed.store(true, std::memory_order_relaxed);
        }
      }
      job.done.fetch_add(1, std::memory_order_acq_rel);
      c = part.cursor.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::worker_loop(int participant) {
  // Not a load: a loop may start before this thread first runs, and it must not be
  // taken as already seen.
  uint64_t seen = 0;
  for (;;) {
    const Clock::time_point idle_since = Clock::now();
    while (jobs_started_.load(std::memory_order_acquire) == seen &&
           !stopping_.load(std::memory_order_relaxed) && Clock::now() - idle_since < kWorkerSpin)
      cpu_relax();
    if (jobs_started_.load() == seen && !stopping_.load()) {
      sleepers_.fetch_add(1);
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      wake_.wait(lock, [&] { return jobs_started_.load() != seen || stopping_.load(); });
      sleepers_.fetch_sub(1);
    }
    if (stopping_.load()) return;
    seen = jobs_started_.load();
    work_on_current_job(participant);
  }
}

}  // namespace tandem
