// CollectiveQueue (comm/collective_queue.h): tasks run one at a time on a thread of their
// own, in submission order; wait() returns once a task and everything before it ran; the
// first failure is rethrown by every later wait and nothing after it runs; destroying the
// queue drops the tasks not started; without a queue, run_collective runs the work at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/test_util.h"
#include "tandem/comm/collective_queue.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

// A latch the test opens: tasks that wait on it hold the queue's thread.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    changed_.notify_all();
  }
  // Waits until opened; false after `limit` (the test then fails instead of hanging).
  bool wait(std::chrono::seconds limit = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

TEST(CollectiveQueue, RunsTasksInSubmissionOrderOnAThreadOfItsOwn) {
  CollectiveQueue queue;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<CollectiveQueue::Ticket> tickets;
  for (int i = 0; i < 50; i++) {
    tickets.push_back(queue.submit([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }));
  }
  for (int i = 0; i < 50; i++) EXPECT_EQ(tickets[i], static_cast<CollectiveQueue::Ticket>(i + 1));
  EXPECT_EQ(queue.last_submitted(), 50u);
  queue.wait_all();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; i++) EXPECT_EQ(order[i], i);
  for (std::thread::id id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads[0]);
  }
}

TEST(CollectiveQueue, SubmitReturnsWhileATaskRunsAndWaitReturnsWhenItIsDone) {
  CollectiveQueue queue;
  Gate gate;
  std::atomic<bool> first_ran = false, second_ran = false, gate_opened = true;
  const CollectiveQueue::Ticket first = queue.submit([&] {
    gate_opened = gate.wait();
    first_ran = true;
  });
  const CollectiveQueue::Ticket second = queue.submit([&] { second_ran = true; });
  // The caller goes on while the queue's thread is held.
  EXPECT_FALSE(queue.done(first));
  EXPECT_FALSE(queue.done(second));
  EXPECT_FALSE(first_ran);
  gate.open();
  queue.wait(second);  // the later ticket covers the earlier one
  EXPECT_TRUE(gate_opened);
  EXPECT_TRUE(first_ran);
  EXPECT_TRUE(second_ran);
  EXPECT_TRUE(queue.done(first));
  EXPECT_TRUE(queue.done(0));
  EXPECT_GT(queue.busy_seconds(), 0.0);
  EXPECT_GE(queue.waited_seconds(), 0.0);
}

TEST(CollectiveQueue, AFailureIsRethrownByEveryLaterWaitAndNothingAfterItRuns) {
  CollectiveQueue queue;
  std::atomic<int> ran = 0;
  queue.submit([&] { ran++; });
  const CollectiveQueue::Ticket failing =
      queue.submit([] { fail("rank 2: no data from rank(s) 1 within 1 s in reduce_sum"); });
  const CollectiveQueue::Ticket after = queue.submit([&] { ran++; });
  EXPECT_CONTAINS(testing::error_of([&] { queue.wait(after); }), "no data from rank(s) 1");
  EXPECT_TRUE(queue.done(failing));
  EXPECT_EQ(ran.load(), 1);
  // Later submissions are dropped too, and waits keep reporting the first failure.
  const CollectiveQueue::Ticket later = queue.submit([&] { ran++; });
  EXPECT_TRUE(queue.done(later));
  EXPECT_CONTAINS(testing::error_of([&] { queue.wait(later); }), "no data from rank(s) 1");
  EXPECT_CONTAINS(testing::error_of([&] { queue.wait_all(); }), "no data from rank(s) 1");
  EXPECT_EQ(ran.load(), 1);
}

TEST(CollectiveQueue, WaitingForATicketNeverHandedOutIsRefused) {
  CollectiveQueue queue;
  EXPECT_CONTAINS(testing::error_of([&] { queue.wait(3); }), "ticket 3 was never handed out");
  queue.wait(0);  // nothing to wait for
}

TEST(CollectiveQueue, DestroyingItDropsTasksNotStartedAndFinishesTheRunningOne) {
  Gate gate;
  std::atomic<bool> running_finished = false;
  std::atomic<int> started_later = 0;
  std::thread opener;
  {
    CollectiveQueue queue;
    std::atomic<bool> running = false;
    queue.submit([&] {
      running = true;
      gate.wait();
      running_finished = true;
    });
    for (int i = 0; i < 5; i++) queue.submit([&] { started_later++; });
    while (!running) std::this_thread::yield();
    // Opened well after the destructor below has started (it has nothing to do but drop
    // the five tasks before it waits).
    opener = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      gate.open();
    });
  }  // the destructor returns only once the running task is done
  EXPECT_TRUE(running_finished);
  EXPECT_EQ(started_later.load(), 0);
  opener.join();
}

TEST(CollectiveQueue, WithoutAQueueTheWorkRunsAtOnce) {
  bool ran = false;
  EXPECT_EQ(run_collective(nullptr, [&] { ran = true; }), 0u);
  EXPECT_TRUE(ran);
  wait_collective(nullptr, 0);  // nothing to wait for
  CollectiveQueue queue;
  ran = false;
  const CollectiveQueue::Ticket ticket = run_collective(&queue, [&] { ran = true; });
  EXPECT_EQ(ticket, 1u);
  wait_collective(&queue, ticket);
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace tandem
