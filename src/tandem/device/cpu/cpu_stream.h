// The CPU backend's streams and events. A stream is one worker thread draining a FIFO
// of tasks; an event is the latest of a chain of markers that streams reach.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "tandem/device/device.h"

namespace tandem {

// One record() of an event: reached once the recording stream gets to it. A marker is
// immutable after it is reached, so waiters read `error` without a lock.
class EventMarker {
 public:
  // Called once, by the recording stream's worker. `error` is that stream's failure
  // message if it failed before reaching the marker (the marker is reached anyway, so
  // that nobody waits forever), empty otherwise.
  void reach(std::string error);
  void wait() const { reached_.wait(false, std::memory_order_acquire); }
  bool reached() const { return reached_.load(std::memory_order_acquire); }
  // Valid once reached(); empty when the work before the marker succeeded.
  const std::string& error() const { return error_; }

 private:
  std::string error_;
  std::atomic<bool> reached_{false};
};

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(const void* owner) : owner_(owner) {}
  void synchronize() override;
  bool ready() override;

  // A new generation: the event now refers to `marker`.
  void set_latest(std::shared_ptr<EventMarker> marker);
  // The generation the event refers to now; null if never recorded.
  std::shared_ptr<EventMarker> latest() const;
  const void* owner() const { return owner_; }

 private:
  const void* owner_;  // the device that created it, to catch mixing devices
  mutable std::mutex mutex_;
  std::shared_ptr<EventMarker> latest_;
};

class CpuStream final : public Stream {
 public:
  // Starts the worker thread.
  CpuStream(const void* owner, std::string name);
  // Drains the queue (running or, after a failure, skipping every task), then joins.
  ~CpuStream() override;
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  std::string_view name() const override { return name_; }
  void synchronize() override;

  // Queues `run`; `what` names it in the failure message ("stream 'h2d': copy failed:
  // ..."), so it must be a string literal or otherwise outlive the task. If the stream
  // has failed, the task is skipped.
  void enqueue(std::string_view what, std::function<void()> run);
  // Queues the reaching of `marker`. It runs even after a failure, carrying the error.
  void enqueue_marker(std::shared_ptr<EventMarker> marker);
  const void* owner() const { return owner_; }

 private:
  struct Task {
    std::string_view what;
    std::function<void()> run;            // empty for a marker
    std::shared_ptr<EventMarker> marker;  // set for a record()
  };
  void push(Task task);
  void work();

  const void* owner_;
  const std::string name_;

  std::mutex mutex_;
  std::condition_variable work_ready_;  // the worker waits for tasks (or stop)
  std::condition_variable task_done_;   // synchronize() waits for finished_ to advance
  std::deque<Task> queue_;
  uint64_t queued_ = 0;                 // tasks ever queued; task i is the i-th (0-based)
  uint64_t finished_ = 0;               // tasks run or skipped; they finish in queue order
  std::optional<std::string> failure_;  // the first failure's message
  uint64_t failed_task_ = 0;            // index of the task that failed
  bool stopping_ = false;

  std::thread worker_;  // last: started once everything above is initialised
};

}  // namespace tandem
