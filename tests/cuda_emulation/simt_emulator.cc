// The fibers, barriers and schedules behind simt_emulator.h.
//
// Switching: a thread's fiber is created with makecontext and entered the first time with
// setcontext; every later switch (millions per test) uses _setjmp/_longjmp, which swap
// only registers, where swapcontext would also make a sigprocmask system call each time.
// glibc's _FORTIFY_SOURCE turns _longjmp into __longjmp_chk, which rejects a jump to
// another stack, so it is undefined before any header is included.
#undef _FORTIFY_SOURCE

#include "simt_emulator.h"

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

// AddressSanitizer must be told about stack switches and may guard shared memory.
#if defined(__SANITIZE_ADDRESS__)
#define CUDA_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_EMULATION_ASAN 1
#endif
#endif
#if defined(CUDA_EMULATION_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace cuda_emulation {

namespace detail {
dim3 thread_index, block_index, block_dim, grid_dim;
}  // namespace detail

namespace {

// Room for the kernels' register arrays and the emulated instructions' locals, also in
// unoptimized and sanitized builds. Allocated once and reused, so untouched pages cost
// nothing.
constexpr size_t kStackBytes = 256 * 1024;
// Bytes on each side of a block's shared memory that must still hold their fill when the
// block finishes: a write out of bounds is then reported even without AddressSanitizer.
constexpr size_t kGuardBytes = 256;
constexpr unsigned char kSharedFill = 0xff;  // NaN in float and in bf16
constexpr unsigned kWarpSize = 32;

struct Barrier {
  unsigned first, count;  // the participating threads
  unsigned arrived = 0;
  const char* operation = "";  // what the arrived threads are at
};

struct Thread {
  std::unique_ptr<char[]> stack;
  ucontext_t start;  // the first entry
  jmp_buf resume;    // later entries: where the thread last yielded
  bool started = false;
  bool done = false;
  const Barrier* waiting = nullptr;  // null: runnable
  AsyncCopies copies;
};

// The state of the launch in progress. One launch at a time: kernels run on the thread
// that launches them, and launch() is not reentrant.
std::vector<Thread> threads;  // as many as the largest block so far: stacks are reused
unsigned block_threads = 0;
int current = -1;  // the running thread; -1 while the scheduler runs
jmp_buf scheduler;
Barrier block;
std::vector<Barrier> warps;
std::vector<std::array<LaneSlot, kWarpSize>> slots;
std::vector<unsigned char> shared_storage;
// The block's static __shared__ variables (see static_shared), by declaration, and the
// threads' votes in __syncthreads_count.
std::map<const void*, std::vector<unsigned char>> static_shared_storage;
std::vector<int> votes;
unsigned char* shared = nullptr;
size_t shared_bytes = 0;
const std::function<void()>* body = nullptr;
std::string fault_message;  // set by the thread that faulted
std::exception_ptr thread_exception;

Schedule schedule = Schedule::kRoundRobin;
uint64_t random_state = 1;

#if defined(CUDA_EMULATION_ASAN)
const void* scheduler_stack_bottom = nullptr;
size_t scheduler_stack_size = 0;
#endif

std::string where() {
  std::ostringstream s;
  s << "block (" << detail::block_index.x << ", " << detail::block_index.y << ", "
    << detail::block_index.z << ")";
  if (current >= 0) s << " thread " << current;
  return s.str();
}

// yield() and resume() hold the _setjmp calls. Never inlined, so that no caller's local
// variable lives in a frame that a _longjmp returns to (where it could be clobbered).

// Switches from the running thread back to the scheduler; returns when the scheduler
// resumes this thread (never, if it is exiting).
__attribute__((noinline)) void yield(bool exiting) {
  Thread& t = threads[current];
#if defined(CUDA_EMULATION_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(exiting ? nullptr : &fake_stack, scheduler_stack_bottom,
                                 scheduler_stack_size);
#endif
  if (exiting || _setjmp(t.resume) == 0) _longjmp(scheduler, 1);
#if defined(CUDA_EMULATION_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
}

// A thread's first frame: runs the kernel body and exits.
void thread_main() {
#if defined(CUDA_EMULATION_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
  try {
    (*body)();
  } catch (...) {
    // Emulated device code does not throw; should it, the exception must not unwind past
    // the fiber's first frame. launch() rethrows it.
    if (!thread_exception) thread_exception = std::current_exception();
  }
  threads[current].done = true;
  yield(/*exiting=*/true);
}

// Runs thread i until it yields.
__attribute__((noinline)) void resume(unsigned i) {
  Thread& t = threads[i];
  current = static_cast<int>(i);
  const dim3& d = detail::block_dim;
  detail::thread_index = dim3(i % d.x, i / d.x % d.y, i / (d.x * d.y));
#if defined(CUDA_EMULATION_ASAN)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, t.stack.get(), kStackBytes);
#endif
  if (_setjmp(scheduler) == 0) {
    if (!t.started) {
      t.started = true;
      setcontext(&t.start);
    }
    _longjmp(t.resume, 1);
  }
#if defined(CUDA_EMULATION_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  current = -1;
}

void arrive(Barrier& b, const char* operation) {
  if (current < 0) fault(std::string(operation) + " outside a kernel");
  if (b.arrived == 0) {
    b.operation = operation;
  } else if (std::strcmp(b.operation, operation) != 0) {
    fault(std::string("divergent synchronization: at ") + operation +
          " while other threads are at " + b.operation);
  }
  if (++b.arrived == b.count) {
    b.arrived = 0;
    for (unsigned i = b.first; i < b.first + b.count; i++) {
      if (threads[i].waiting == &b) threads[i].waiting = nullptr;
    }
  } else {
    threads[current].waiting = &b;
  }
  // Yield even when this arrival completed the barrier: the schedule, not the arrival
  // order, decides which thread runs first after a barrier.
  yield(/*exiting=*/false);
}

bool runnable(unsigned i) { return !threads[i].done && threads[i].waiting == nullptr; }

// The next thread to run, or -1 if none can.
int pick(unsigned last) {
  const unsigned n = block_threads;
  switch (schedule) {
    case Schedule::kLowestFirst:
      for (unsigned i = 0; i < n; i++) {
        if (runnable(i)) return static_cast<int>(i);
      }
      return -1;
    case Schedule::kHighestFirst:
      for (unsigned i = n; i-- > 0;) {
        if (runnable(i)) return static_cast<int>(i);
      }
      return -1;
    case Schedule::kRandom: {
      static std::vector<unsigned> candidates;
      candidates.clear();
      for (unsigned i = 0; i < n; i++) {
        if (runnable(i)) candidates.push_back(i);
      }
      if (candidates.empty()) return -1;
      random_state = random_state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<int>(candidates[(random_state >> 33) % candidates.size()]);
    }
    case Schedule::kRoundRobin:
      break;
  }
  for (unsigned k = 1; k <= n; k++) {
    const unsigned i = (last + k) % n;
    if (runnable(i)) return static_cast<int>(i);
  }
  return -1;
}

// Names the barriers the threads of a deadlocked block wait at.
std::string deadlock_report() {
  std::ostringstream report;
  report << "deadlock: no thread can proceed;";
  if (block.arrived > 0) {
    report << " " << block.arrived << " of " << block.count << " threads wait at __syncthreads;";
  }
  for (size_t w = 0; w < warps.size(); w++) {
    if (warps[w].arrived > 0) {
      report << " " << warps[w].arrived << " lanes of warp " << w << " wait at "
             << warps[w].operation << ";";
    }
  }
  unsigned exited = 0;
  for (unsigned i = 0; i < block_threads; i++) exited += threads[i].done;
  report << " " << exited << " threads have exited (a barrier that some threads skip?)";
  return report.str();
}

void fill_shared() {
#if defined(CUDA_EMULATION_ASAN)
  ASAN_UNPOISON_MEMORY_REGION(shared - kGuardBytes, shared_bytes + 2 * kGuardBytes);
#endif
  std::memset(shared - kGuardBytes, kSharedFill, shared_bytes + 2 * kGuardBytes);
#if defined(CUDA_EMULATION_ASAN)
  ASAN_POISON_MEMORY_REGION(shared - kGuardBytes, kGuardBytes);
  ASAN_POISON_MEMORY_REGION(shared + shared_bytes, kGuardBytes);
#endif
}

bool guards_intact() {
#if defined(CUDA_EMULATION_ASAN)
  ASAN_UNPOISON_MEMORY_REGION(shared - kGuardBytes, shared_bytes + 2 * kGuardBytes);
#endif
  for (size_t i = 0; i < kGuardBytes; i++) {
    if (shared[-1 - static_cast<ptrdiff_t>(i)] != kSharedFill) return false;
    if (shared[shared_bytes + i] != kSharedFill) return false;
  }
  return true;
}

// Makes t start at thread_main. Not inlined: getcontext, like _setjmp, "returns twice" as
// far as the compiler knows, which would cast doubt on the caller's local variables.
__attribute__((noinline)) void prepare(Thread& t) {
  if (!t.stack) t.stack.reset(new char[kStackBytes]);  // uninitialized: pages stay untouched
  t.started = t.done = false;
  t.waiting = nullptr;
  t.copies.open.clear();
  t.copies.committed.clear();
  getcontext(&t.start);
  t.start.uc_stack.ss_sp = t.stack.get();
  t.start.uc_stack.ss_size = kStackBytes;
  t.start.uc_link = nullptr;  // thread_main never returns
  makecontext(&t.start, thread_main, 0);
}

void run_block() {
  const unsigned n = block_threads;
  for (unsigned i = 0; i < n; i++) prepare(threads[i]);
  block = Barrier{0, n};
  warps.clear();
  for (unsigned first = 0; first < n; first += kWarpSize) {
    warps.push_back(Barrier{first, std::min(kWarpSize, n - first)});
  }
  slots.assign(warps.size(), {});
  fill_shared();
  static_shared_storage.clear();
  votes.assign(n, 0);

  unsigned last = n - 1;  // so that round robin starts at thread 0
  for (;;) {
    const int next = pick(last);
    if (next < 0) {
      bool all_done = true;
      for (unsigned i = 0; i < n; i++) all_done = all_done && threads[i].done;
      if (all_done) break;
      fault(deadlock_report());
    }
    resume(static_cast<unsigned>(next));
    last = static_cast<unsigned>(next);
    if (thread_exception) std::rethrow_exception(thread_exception);
    if (!fault_message.empty()) throw EmulationError(fault_message);
  }
  if (!guards_intact()) {
    fault("a thread wrote outside the block's " + std::to_string(shared_bytes) +
          " bytes of dynamic shared memory");
  }
}

// Leaves the emulator idle however launch() ends.
struct LaunchScope {
  LaunchScope() {
    fault_message.clear();
    thread_exception = nullptr;
  }
  ~LaunchScope() {
    current = -1;
    body = nullptr;
#if defined(CUDA_EMULATION_ASAN)
    if (shared) ASAN_UNPOISON_MEMORY_REGION(shared - kGuardBytes, shared_bytes + 2 * kGuardBytes);
#endif
    shared = nullptr;
  }
};

}  // namespace

void set_schedule(Schedule s, uint64_t seed) {
  schedule = s;
  random_state = seed;
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kRoundRobin:
      return "round_robin";
    case Schedule::kLowestFirst:
      return "lowest_first";
    case Schedule::kHighestFirst:
      return "highest_first";
    case Schedule::kRandom:
      return "random";
  }
  return "?";
}

void fault(const std::string& what) {
  const std::string message = "CUDA emulation: " + where() + ": " + what;
  if (current < 0) throw EmulationError(message);
  // On a thread: end it and let the scheduler throw, from the launching thread's stack.
  if (fault_message.empty()) fault_message = message;
  threads[current].done = true;
  yield(/*exiting=*/true);
  std::abort();  // unreachable: an exiting thread is never resumed
}

// The launch state above is global: launches from several host threads (the emulated
// runtime runs every stream's work on the thread that queues it) take turns.
std::mutex launch_mutex;
thread_local bool launching = false;  // on this host thread, or a fiber of its launch

void launch(dim3 grid, dim3 block_dim, size_t bytes, const std::function<void()>& kernel) {
  if (launching) fault("launch() from inside a kernel");
  std::lock_guard<std::mutex> lock(launch_mutex);
  launching = true;
  struct Done {
    ~Done() { launching = false; }
  } done;
  if (body != nullptr) fault("launch() from inside a kernel");
  const unsigned n = block_dim.x * block_dim.y * block_dim.z;
  if (n == 0 || n > 1024) fault("a block of " + std::to_string(n) + " threads");
  if (grid.y > 65535 || grid.z > 65535 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
    fault("grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
          std::to_string(grid.z) + ") is outside the hardware's limits");
  }
  LaunchScope scope;
  body = &kernel;
  block_threads = n;
  if (threads.size() < n) threads.resize(n);
  // Shared memory 16-byte aligned (as the kernels declare it), with guards on both sides.
  shared_storage.resize(bytes + 2 * kGuardBytes + 16);
  unsigned char* const storage = shared_storage.data();
  const size_t misalignment = reinterpret_cast<uintptr_t>(storage + kGuardBytes) % 16;
  shared = storage + kGuardBytes + (misalignment == 0 ? 0 : 16 - misalignment);
  shared_bytes = bytes;
  detail::grid_dim = grid;
  detail::block_dim = block_dim;
  for (unsigned z = 0; z < grid.z; z++) {
    for (unsigned y = 0; y < grid.y; y++) {
      for (unsigned x = 0; x < grid.x; x++) {
        detail::block_index = dim3(x, y, z);
        run_block();
      }
    }
  }
}

unsigned char* shared_memory() { return shared; }
size_t shared_memory_bytes() { return shared_bytes; }

void block_barrier() { arrive(block, "__syncthreads"); }
void warp_barrier(const char* operation) {
  if (current < 0) fault(std::string(operation) + " outside a kernel");
  arrive(warps[static_cast<unsigned>(current) / kWarpSize], operation);
}

LaneSlot* warp_slots() { return slots[static_cast<unsigned>(current) / kWarpSize].data(); }
unsigned lane_id() { return static_cast<unsigned>(current) % kWarpSize; }

int syncthreads_count(int predicate) {
  if (current < 0) fault("__syncthreads_count outside a kernel");
  votes[static_cast<unsigned>(current)] = predicate != 0;
  arrive(block, "__syncthreads_count");
  int count = 0;
  for (unsigned i = 0; i < block_threads; i++) count += votes[i];
  // Every thread has counted before any thread's next vote overwrites its slot.
  arrive(block, "__syncthreads_count");
  return count;
}

void* static_shared(const void* key, size_t bytes) {
  if (current < 0) fault("a __shared__ variable outside a kernel");
  std::vector<unsigned char>& storage = static_shared_storage[key];
  if (storage.empty()) {
    // 16 bytes of slack so that the variable can be 16-byte aligned; filled like dynamic
    // shared memory, so that a value read before it was written is NaN.
    storage.assign(bytes + 16, kSharedFill);
  } else if (storage.size() != bytes + 16) {
    fault("a __shared__ variable whose size changed");
  }
  const uintptr_t address = reinterpret_cast<uintptr_t>(storage.data());
  return storage.data() + (16 - address % 16) % 16;
}

AsyncCopies& async_copies() {
  if (current < 0) fault("cp.async outside a kernel");
  return threads[current].copies;
}

}  // namespace cuda_emulation
