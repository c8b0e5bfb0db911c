// The order in which the emulated GPU runs the work queued on its streams.
//
// By default (StreamOrder::kImmediate) every stream operation runs to completion when it
// is queued, on the calling thread: each stream is trivially in order, and so is every
// pair of streams, which hides a missing cross-stream event. The other orders make the
// emulated streams as independent as a GPU's are:
//
//  - kLazy: queued work runs only when the host needs it (a stream or event
//    synchronisation, a copy into pageable host memory, a free) and then only the work
//    needed for that, following events back to the streams that record them. Work on
//    another stream that nobody waited for runs as late as possible, so a reader that
//    forgot to wait for it reads what was there before.
//  - kRandom: whenever the host needs work done, the next operation to run is drawn at
//    random from the heads of all streams that may run (a wait on an event whose record
//    has not run yet blocks its stream), from a seeded generator.
//
// Either way the only order kept is the one CUDA promises: within a stream, and across
// streams through cudaStreamWaitEvent on an earlier cudaEventRecord. Work on the legacy
// default stream (null) first runs everything queued, as the legacy stream synchronises
// with the blocking streams. A host synchronisation that can never complete (a wait on an
// event whose record is queued behind the wait itself) throws EmulationError.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

typedef struct CUstream_st* cudaStream_t;

namespace cuda_emulation {

enum class StreamOrder { kImmediate, kLazy, kRandom };

class StreamScheduler {
 public:
  void set_order(StreamOrder order, uint64_t seed) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    run_until([] { return false; }, nullptr, /*everything=*/true);
    order_ = order;
    random_.seed(seed);
  }
  StreamOrder order() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return order_;
  }

  void stream_created(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    streams_.push_back(stream);
    queues_[stream];
  }
  // Runs what the stream still has queued first: its work outlives a destroy on a GPU.
  void stream_destroyed(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    drain_stream(stream);
    queues_.erase(stream);
    std::erase(streams_, stream);
  }

  // Queues `work` on `stream` (runs it now in kImmediate order).
  void submit(cudaStream_t stream, std::function<void()> work) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (order_ == StreamOrder::kImmediate) {
      work();
      return;
    }
    if (stream == nullptr) {
      drain_all();
      work();
      return;
    }
    queues_.at(stream).push_back(Task{std::move(work), nullptr, 0});
  }

  // cudaEventRecord: the event completes once the work queued on `stream` before it has
  // run; `on_complete` then runs (to stamp the time).
  void record(const void* event, cudaStream_t stream, std::function<void()> on_complete) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    EventState& state = events_[event];
    const uint64_t generation = ++state.recorded;
    state.recorder[generation] = stream;
    submit(stream, [this, event, generation, on_complete = std::move(on_complete)] {
      EventState& s = events_[event];
      s.completed = std::max(s.completed, generation);
      s.recorder.erase(generation);
      on_complete();
    });
  }
  // cudaStreamWaitEvent: later work on `stream` waits for the event's latest record.
  void wait(cudaStream_t stream, const void* event) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    const uint64_t generation = events_[event].recorded;
    if (order_ == StreamOrder::kImmediate || generation == 0) return;
    if (stream == nullptr) {
      drain_event(event);
      return;
    }
    queues_.at(stream).push_back(Task{{}, event, generation});
  }
  bool event_complete(const void* event) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    const auto it = events_.find(event);
    return it == events_.end() || it->second.completed >= it->second.recorded;
  }
  // cudaEventQuery: makes one step of progress towards the event, so that a host that
  // polls it is not stuck, and says whether it is complete.
  bool query_event(const void* event) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (!event_complete(event)) step_towards(event_stream(event), false);
    return event_complete(event);
  }
  void event_destroyed(const void* event) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    drain_event(event);
    events_.erase(event);
  }

  void drain_stream(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (stream == nullptr) {
      drain_all();
      return;
    }
    run_until([this, stream] { return queues_.at(stream).empty(); }, stream, false);
  }
  void drain_event(const void* event) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    run_until([this, event] { return event_complete(event); }, event_stream(event), false);
  }
  void drain_all() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    run_until([] { return false; }, nullptr, true);
  }

 private:
  struct Task {
    std::function<void()> work;  // empty for a wait
    const void* event;           // a wait: runs once this event ...
    uint64_t generation;         // ... has completed this record
  };
  struct EventState {
    uint64_t recorded = 0, completed = 0;
    std::map<uint64_t, cudaStream_t> recorder;  // pending records and their streams
  };

  bool runnable(const Task& task) {
    return task.work || events_[task.event].completed >= task.generation;
  }
  // The stream that will complete the event's latest record (null when none is pending).
  cudaStream_t event_stream(const void* event) {
    const EventState& state = events_[event];
    return state.recorder.empty() ? nullptr : state.recorder.rbegin()->second;
  }

  // Runs one task: in kLazy order the one `target` needs next (following the events it
  // waits for), else a random runnable one. Returns false when nothing can run.
  bool step_towards(cudaStream_t target, bool everything) {
    cudaStream_t chosen = nullptr;
    if (order_ == StreamOrder::kLazy && !everything && target != nullptr) {
      cudaStream_t at = target;
      for (size_t hops = 0; hops <= streams_.size(); hops++) {
        auto& queue = queues_.at(at);
        if (queue.empty()) return false;
        if (runnable(queue.front())) {
          chosen = at;
          break;
        }
        at = event_stream(queue.front().event);
        if (at == nullptr) return false;
      }
    } else {
      std::vector<cudaStream_t> ready;
      for (cudaStream_t stream : streams_) {
        const auto& queue = queues_.at(stream);
        if (!queue.empty() && runnable(queue.front())) ready.push_back(stream);
      }
      if (ready.empty()) return false;
      chosen = order_ == StreamOrder::kRandom
                   ? ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(random_)]
                   : ready.front();
    }
    if (chosen == nullptr) return false;
    Task task = std::move(queues_.at(chosen).front());
    queues_.at(chosen).pop_front();
    if (task.work) task.work();
    return true;
  }

  // Runs tasks until done() (everything: until every queue is empty).
  template <typename Done>
  void run_until(Done done, cudaStream_t target, bool everything) {
    while (!done()) {
      if (step_towards(target, everything)) continue;
      bool pending = false;
      for (const auto& entry : queues_) pending = pending || !entry.second.empty();
      if (!pending && (everything || done())) return;
      throw std::runtime_error(
          "emulated streams: a host synchronisation waits for work that can never run (a "
          "cudaStreamWaitEvent on an event whose record is queued behind it)");
    }
  }

  std::recursive_mutex mutex_;
  StreamOrder order_ = StreamOrder::kImmediate;
  std::mt19937_64 random_{1};
  std::vector<cudaStream_t> streams_;  // in creation order
  std::map<cudaStream_t, std::deque<Task>> queues_;
  std::map<const void*, EventState> events_;
};

inline StreamScheduler& stream_scheduler() {
  static StreamScheduler scheduler;
  return scheduler;
}

// For tests: the order of later stream work (what is queued now runs first).
inline void set_stream_order(StreamOrder order, uint64_t seed = 1) {
  stream_scheduler().set_order(order, seed);
}

}  // namespace cuda_emulation
