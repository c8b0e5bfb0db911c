#include "tandem/comm/collective_queue.h"

#include <chrono>
#include <utility>

#include "tandem/core/error.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

CollectiveQueue::CollectiveQueue() : worker_([this] { run(); }) {}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // Tasks not started are dropped: after a failure on this rank the others may never
    // join them. The running one ends as a synchronous collective would.
    tasks_.clear();
  }
  work_ready_.notify_all();
  worker_.join();
}

CollectiveQueue::Ticket CollectiveQueue::submit(std::function<void()> work) {
  TANDEM_CHECK(work != nullptr, "CollectiveQueue: an empty task");
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = ++submitted_;
    if (failure_) {
      finished_ = ticket;  // dropped: the ranks are out of step
    } else {
      tasks_.push_back(std::move(work));
    }
  }
  work_ready_.notify_one();
  return ticket;
}

bool CollectiveQueue::done(Ticket ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_ >= ticket;
}

void CollectiveQueue::wait(Ticket ticket) {
  const Clock::time_point start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  TANDEM_CHECK(ticket <= submitted_, "CollectiveQueue: ticket ", ticket, " was never handed out (",
               submitted_, " so far)");
  work_done_.wait(lock, [&] { return finished_ >= ticket; });
  waited_seconds_ += seconds_since(start);
  if (failure_) std::rethrow_exception(failure_);
}

void CollectiveQueue::wait_all() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = submitted_;
  }
  wait(last);
}

CollectiveQueue::Ticket CollectiveQueue::last_submitted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_;
}

double CollectiveQueue::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_seconds_;
}

double CollectiveQueue::waited_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waited_seconds_;
}

void CollectiveQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    const Clock::time_point start = Clock::now();
    std::exception_ptr failure;
    try {
      task();
    } catch (...) {
      failure = std::current_exception();
    }
    task = nullptr;  // what the task captured goes before the waiters hear of it
    lock.lock();
    busy_seconds_ += seconds_since(start);
    finished_++;
    if (failure && !failure_) {
      failure_ = failure;
      // Nothing after a failed collective can run in step with the other ranks.
      finished_ += tasks_.size();
      tasks_.clear();
    }
    work_done_.notify_all();
  }
}

}  // namespace tandem
