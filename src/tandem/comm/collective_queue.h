// Collectives that run while the rank computes (`zero_optimization.overlap_comm`): a thread
// of their own runs the collectives submitted to it one at a time, in submission order,
// while the training thread goes on with the next block's kernels, and the training thread
// waits for a collective only where it needs its result.
//
// Why one thread and one order: every rank submits the same collectives in the same order
// (the model's order of blocks is the same on every rank), so running them in that order
// keeps the ranks matched without tags or handshakes, exactly as synchronous calls would;
// and the sums are the communicator's, in its fixed tree order, so overlapping changes when
// a collective runs, never its bits.
//
// The communicator the work uses must not be used by another thread at the same time:
// give the queue one of its own (Communicator::duplicate) and keep the original for the
// training thread's own exchanges.
//
// Failures: a collective that throws (a timeout naming a dead rank, an aborted group)
// leaves the ranks out of step, so the queue runs nothing after it: every later task is
// dropped, and every wait from then on rethrows that first error. Destroying the queue
// drops the tasks not started and waits for the one running, which ends as a synchronous
// collective would: done, or failed within the communicator's timeout.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace tandem {

class CollectiveQueue {
 public:
  // Numbers the submitted tasks 1, 2, ... in order; 0 is "nothing" (always done).
  using Ticket = uint64_t;

  CollectiveQueue();
  ~CollectiveQueue();
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  // Queues `work` behind everything submitted before it.
  Ticket submit(std::function<void()> work);
  // Whether task `ticket` (and so everything before it) has finished, or was dropped after
  // a failure (wait then rethrows). Never blocks.
  bool done(Ticket ticket) const;
  // Waits until task `ticket` and everything before it has run; rethrows the queue's first
  // failure, if any task up to now failed.
  void wait(Ticket ticket);
  // Waits for everything submitted so far.
  void wait_all();
  // The last ticket handed out (0 before the first).
  Ticket last_submitted() const;

  // Seconds the queue's thread has spent running tasks, and seconds callers have spent
  // blocked in wait(): with work that overlaps, the second is less than the first.
  double busy_seconds() const;
  double waited_seconds() const;

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<std::function<void()>> tasks_;
  Ticket submitted_ = 0;
  Ticket finished_ = 0;  // every task up to here has run (or was dropped)
  std::exception_ptr failure_;
  bool stopping_ = false;
  double busy_seconds_ = 0.0;
  double waited_seconds_ = 0.0;
  std::thread worker_;  // last: it starts once everything above is initialized
};

// Runs `work` on `queue` and returns its ticket, or, without a queue, runs it now and
// returns 0: code written once for synchronous and overlapped collectives.
inline CollectiveQueue::Ticket run_collective(CollectiveQueue* queue, std::function<void()> work) {
  if (queue != nullptr) return queue->submit(std::move(work));
  work();
  return 0;
}
// Waits for `ticket` of `queue` (nothing to wait for without a queue or for ticket 0).
inline void wait_collective(CollectiveQueue* queue, CollectiveQueue::Ticket ticket) {
  if (queue != nullptr && ticket != 0) queue->wait(ticket);
}

}  // namespace tandem
