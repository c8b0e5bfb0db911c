// The thread pool's contract (core/thread_pool.h): every index exactly once, in chunks of
// the size asked for; the first exception rethrown and the pool still usable; a nested
// loop run inline; and a loop that finishes while one of its threads is held up, because
// the others take over what that thread has not started (a static split would wait).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

TEST(ThreadPool, ParallelForCoversEveryIndexOnceInChunksOfTheAskedSize) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads, false);
    ASSERT_EQ(pool.size(), threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{100003}}) {
      for (size_t min_chunk : {size_t{1}, size_t{16}, size_t{4096}}) {
        SCOPED_TRACE(testing::Message()
                     << threads << " threads, n " << n << ", chunk " << min_chunk);
        std::vector<std::atomic<int>> seen(n);
        std::atomic<size_t> chunks{0};
        pool.parallel_for(n, min_chunk, [&](size_t begin, size_t end) {
          ASSERT_LT(begin, end);
          ASSERT_LE(end, n);
          ASSERT_EQ(begin % min_chunk, 0u) << "a chunk starts where the caller allows";
          chunks++;
          for (size_t i = begin; i < end; i++) seen[i]++;
        });
        for (size_t i = 0; i < n; i++) ASSERT_EQ(seen[i].load(), 1) << "index " << i;
        EXPECT_LE(chunks.load(), 8u * threads) << "at most 8 chunks per participant";
      }
    }
  }
}

TEST(ThreadPool, RunGivesEveryPartOnceAndSplitRangeTilesTheRange) {
  ThreadPool pool(3, false);
  std::vector<int> owner(1000, -1);
  std::vector<std::atomic<int>> calls(3);
  pool.run([&](int part) {
    calls[part]++;
    const Range r = split_range(owner.size(), pool.size(), part, 16);
    for (size_t i = r.begin; i < r.end; i++) owner[i] = part;
  });
  for (const auto& c : calls) EXPECT_EQ(c.load(), 1);
  for (size_t i = 0; i < owner.size(); i++) {
    ASSERT_GE(owner[i], 0) << i;
    if (i > 0) {
      ASSERT_GE(owner[i], owner[i - 1]);
    }
  }
}

TEST(ThreadPool, RethrowsTheFirstErrorSkipsTheRestAndStaysUsable) {
  ThreadPool pool(3, false);
  EXPECT_THROW(pool.parallel_for(1000, 1,
                                 [&](size_t begin, size_t) {
                                   if (begin == 0) throw Error("chunk failed");
                                 }),
               Error);
  int calls = 0;
  std::mutex mutex;
  pool.run([&](int) {
    std::lock_guard<std::mutex> lock(mutex);
    calls++;
  });
  EXPECT_EQ(calls, 3);
}

TEST(ThreadPool, ANestedLoopRunsInlineInsteadOfDeadlocking) {
  ThreadPool pool(2, false);
  std::atomic<size_t> total{0};
  auto done = std::async(std::launch::async, [&] {
    pool.parallel_for(16, 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; i++)
        pool.parallel_for(10, 1, [&](size_t b, size_t e) { total += e - b; });
    });
  });
  ASSERT_EQ(done.wait_for(30s), std::future_status::ready) << "nested parallel_for deadlocked";
  EXPECT_EQ(total.load(), 160u);
}

// Two threads: the caller's part is items 0-7, the worker's 8-15. Item 8 (the worker's
// first) cannot finish until items 9-15 are done. With a static split its thread would
// have to run them after it: the loop would never end. Here whoever is free takes them.
TEST(ThreadPool, FinishesWhileAThreadIsHeldUpByTakingOverItsItems) {
  ThreadPool pool(2, false);
  std::atomic<int> others_done{0};
  auto done = std::async(std::launch::async, [&] {
    pool.parallel_for(16, 1, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; i++) {
        if (i == 8) {
          while (others_done.load() < 7) std::this_thread::sleep_for(1ms);
        } else if (i > 8) {
          others_done++;
        }
      }
    });
  });
  ASSERT_EQ(done.wait_for(30s), std::future_status::ready)
      << "the loop waited for the held-up thread to run its own items";
}

// Loops from two threads at once share the pool one after the other.
TEST(ThreadPool, LoopsFromTwoThreadsBothComplete) {
  ThreadPool pool(3, false);
  std::atomic<size_t> a{0}, b{0};
  auto first = std::async(std::launch::async, [&] {
    for (int r = 0; r < 200; r++)
      pool.parallel_for(100, 1, [&](size_t s, size_t e) { a += e - s; });
  });
  auto second = std::async(std::launch::async, [&] {
    for (int r = 0; r < 200; r++)
      pool.parallel_for(100, 1, [&](size_t s, size_t e) { b += e - s; });
  });
  ASSERT_EQ(first.wait_for(60s), std::future_status::ready);
  ASSERT_EQ(second.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(a.load(), 20000u);
  EXPECT_EQ(b.load(), 20000u);
}

TEST(ThreadPool, DefaultThreadCountFollowsOmpNumThreads) {
  const char* old = std::getenv("OMP_NUM_THREADS");
  const std::string saved = old != nullptr ? old : "";
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(default_thread_count(), 3);
  EXPECT_EQ(ThreadPool(0, false).size(), 3);
  setenv("OMP_NUM_THREADS", "junk", 1);
  EXPECT_EQ(default_thread_count(), static_cast<int>(allowed_cpus().size()));
  if (old != nullptr) {
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("OMP_NUM_THREADS");
  }
}

// A pool of more threads than allowed CPUs is never pinned (two of its threads would share
// a core they could not leave).
TEST(ThreadPool, DoesNotPinMoreThreadsThanCpus) {
  const int cpus = static_cast<int>(allowed_cpus().size());
  ThreadPool pool(cpus + 1, true);
  EXPECT_FALSE(pool.pinned());
}

// The CPUs the calling thread may run on.
std::vector<int> own_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

// A pinned pool unbinds its workers when other programs come to need their cores, and binds
// them again once those are gone: a neighbour that starts after the pool does not meet
// workers stuck on the cores it took. The others' load is given here; the pool looks at
// the start of a loop (every time: recheck 0).
TEST(ThreadPool, UnbindsItsWorkersWhileOthersNeedTheirCores) {
  const int cpus = static_cast<int>(allowed_cpus().size());
  if (cpus < 2) GTEST_SKIP() << "one allowed CPU: a pool of 2 is never pinned";
  std::atomic<long> others{0};
  ThreadPool pool(
      2, true, [&] { return others.load(); }, 0ms);
  if (!pool.pinned()) GTEST_SKIP() << "this machine forbids binding threads to CPUs";
  // Every thread that runs a chunk says which CPUs it may run on.
  const auto affinities = [&] {
    std::mutex mutex;
    std::vector<std::vector<int>> seen;
    pool.parallel_for(64, 1, [&](size_t, size_t) {
      std::this_thread::sleep_for(100us);
      const std::lock_guard lock(mutex);
      seen.push_back(own_affinity());
    });
    return seen;
  };
  for (const std::vector<int>& a : affinities())
    EXPECT_TRUE(a.size() == 1 || a == allowed_cpus()) << "the worker is bound to one CPU";
  // Room for the others beside the pool's 2 threads: still bound.
  others = cpus - 2;
  affinities();
  EXPECT_TRUE(pool.pinned());
  // One more than that: unbound, every thread free to run anywhere it may.
  others = cpus - 1;
  for (const std::vector<int>& a : affinities()) EXPECT_EQ(a, allowed_cpus());
  EXPECT_FALSE(pool.pinned());
  // Gone again: bound again. A load that cannot be read leaves the workers unbound.
  others = 0;
  affinities();
  EXPECT_TRUE(pool.pinned());
  others = -1;
  affinities();
  EXPECT_FALSE(pool.pinned());
}

// The others' load as /proc tells it leaves out this process's own threads: four of ours
// kept running do not raise it by four. (The fewest of ten looks each, so that a moment's
// work of another program does not decide.)
TEST(ThreadPool, OthersRunnableThreadsLeavesOutThisProcess) {
  const auto fewest_of_ten_looks = [] {
    long fewest = std::numeric_limits<long>::max();
    for (int look = 0; look < 10; look++) {
      fewest = std::min(fewest, others_runnable_threads());
      std::this_thread::sleep_for(1ms);
    }
    return fewest;
  };
  const long before = fewest_of_ten_looks();
  ASSERT_GE(before, 0) << "/proc/loadavg or /proc/self/task could not be read";
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < 4; i++)
    busy.emplace_back([&] {
      while (!stop.load()) {
      }
    });
  std::this_thread::sleep_for(10ms);
  const long beside_ours = fewest_of_ten_looks();
  stop = true;
  for (std::thread& t : busy) t.join();
  EXPECT_LT(beside_ours, before + 4) << "this process's running threads were counted";
}

}  // namespace
}  // namespace tandem
