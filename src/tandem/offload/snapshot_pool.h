// A bounded pool of pinned host buffers that a lazy checkpoint's snapshot streams through
// when a full second copy of the optimizer state does not fit in host memory.
//
// The update engine's capture (UpdateEngine::begin_streamed_capture) takes a free slot,
// queues the copies of one piece of the state into it (every state array of a flat range:
// array k at data(slot) + k * range.size()), records copied(slot) behind them and hands
// the slot over with fill(). The checkpoint writer takes filled slots with next(), waits
// for copied(slot), writes the piece and releases the slot. When every slot is full the
// capture waits for the writer (back-pressure), and with it the next update of the
// subgroups not yet captured: that wait is the price of the smaller memory, and it shows
// in UpdateStepStats::capture_wait_ms.
//
// A writer that fails abandons the capture: acquire() then returns nothing, so the
// capture ends without waiting for a writer that is gone.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "tandem/device/device.h"
#include "tandem/model/param_range.h"

namespace tandem {

class SnapshotPool {
 public:
  // `slots` (at least 2, so that a copy and a write overlap) buffers of `slot_floats`
  // floats each, in `device`'s pinned host memory.
  SnapshotPool(Device& device, size_t slots, size_t slot_floats);
  SnapshotPool(const SnapshotPool&) = delete;
  SnapshotPool& operator=(const SnapshotPool&) = delete;

  size_t num_slots() const { return events_.size(); }
  size_t slot_floats() const { return slot_floats_; }
  size_t bytes() const { return memory_.bytes(); }

  // A new capture: every slot free, nothing filled, not closed or abandoned.
  void open();

  // --- the capture's side
  // Blocks until a slot is free and returns it; nothing once the writer abandoned.
  std::optional<size_t> acquire();
  float* data(size_t slot) { return memory_.as<float>() + slot * slot_floats_; }
  Event& copied(size_t slot) { return *events_.at(slot); }
  // The copies of `range` into `slot` are queued and copied(slot) recorded behind them.
  void fill(size_t slot, ParamRange range);
  // No more pieces in this capture.
  void close();

  // --- the writer's side
  struct Piece {
    size_t slot = 0;
    ParamRange range;
  };
  // The next filled slot, in the order filled (wait for copied(slot) before reading it);
  // nothing once the capture is closed and every piece taken.
  std::optional<Piece> next();
  void release(size_t slot);
  // The writer gives up: acquire() returns nothing from now on.
  void abandon();

  // Milliseconds acquire() waited for a free slot since open(): the back-pressure.
  double acquire_wait_ms() const;

 private:
  DeviceAllocation memory_;
  size_t slot_floats_;
  std::vector<std::unique_ptr<Event>> events_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<size_t> free_;
  std::deque<Piece> filled_;
  bool closed_ = false, abandoned_ = false;
  double acquire_wait_ms_ = 0;
};

}  // namespace tandem
