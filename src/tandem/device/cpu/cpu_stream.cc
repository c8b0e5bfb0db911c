#include "tandem/device/cpu/cpu_stream.h"

#include <pthread.h>

#include <exception>
#include <utility>

namespace tandem {

void EventMarker::reach(std::string error) {
  error_ = std::move(error);
  // The release store publishes error_ to whoever sees reached_ == true.
  reached_.store(true, std::memory_order_release);
  reached_.notify_all();
}

void CpuEvent::synchronize() {
  const std::shared_ptr<EventMarker> marker = latest();
  if (marker == nullptr) return;  // never recorded: nothing to wait for, as in CUDA
  marker->wait();
  if (!marker->error().empty()) throw Error(marker->error());
}

bool CpuEvent::ready() {
  const std::shared_ptr<EventMarker> marker = latest();
  return marker == nullptr || marker->reached();
}

void CpuEvent::set_latest(std::shared_ptr<EventMarker> marker) {
  std::lock_guard lock(mutex_);
  latest_ = std::move(marker);
}

std::shared_ptr<EventMarker> CpuEvent::latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

CpuStream::CpuStream(const void* owner, std::string name)
    : owner_(owner), name_(std::move(name)), worker_([this] { work(); }) {
  // Visible in gdb and top; Linux limits thread names to 15 characters.
  const std::string thread_name = ("tandem:" + name_).substr(0, 15);
  pthread_setname_np(worker_.native_handle(), thread_name.c_str());
}

CpuStream::~CpuStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_one();
  worker_.join();
}

void CpuStream::synchronize() {
  std::unique_lock lock(mutex_);
  const uint64_t target = queued_;
  task_done_.wait(lock, [&] { return finished_ >= target; });
  // Only a failure among the tasks this call waited for is reported, so the result does
  // not depend on how far the worker got meanwhile; the failure is sticky because
  // every later target lies beyond it.
  if (failure_ && failed_task_ < target) throw Error(*failure_);
}

void CpuStream::enqueue(std::string_view what, std::function<void()> run) {
  push(Task{.what = what, .run = std::move(run), .marker = nullptr});
}

void CpuStream::enqueue_marker(std::shared_ptr<EventMarker> marker) {
  push(Task{.what = "record", .run = nullptr, .marker = std::move(marker)});
}

void CpuStream::push(Task task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    queued_++;
  }
  work_ready_.notify_one();
}

void CpuStream::work() {
  // Only this thread writes failure_, so it keeps its own copy to read without the lock.
  std::string failure;
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has finished
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error;
    if (task.marker != nullptr) {
      task.marker->reach(failure);
    } else if (failure.empty()) {
      try {
        task.run();
      } catch (const std::exception& e) {
        error = cat("stream '", name_, "': ", task.what, " failed: ", e.what());
      } catch (...) {
        error = cat("stream '", name_, "': ", task.what, " failed with a non-standard exception");
      }
    }
    // Free what the task captured before it counts as finished, so a synchronize()
    // that returns sees no lingering references.
    task = Task{};
    {
      std::lock_guard lock(mutex_);
      if (!error.empty()) {
        failure = error;
        failure_ = std::move(error);
        failed_task_ = finished_;
      }
      finished_++;
    }
    task_done_.notify_all();
  }
}

}  // namespace tandem
