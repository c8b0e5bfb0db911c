#include "tandem/offload/snapshot_pool.h"

#include "tandem/core/error.h"
#include "tandem/core/timer.h"

namespace tandem {

SnapshotPool::SnapshotPool(Device& device, size_t slots, size_t slot_floats)
    : slot_floats_(slot_floats) {
  TANDEM_CHECK(slots >= 2 && slot_floats > 0, "snapshot pool: ", slots, " slots of ", slot_floats,
               " floats; it needs at least 2 slots of at least one float");
  memory_ = device.allocate(MemorySpace::kPinnedHost, slots * slot_floats * sizeof(float));
  for (size_t i = 0; i < slots; i++) events_.push_back(device.create_event());
  open();
}

void SnapshotPool::open() {
  std::lock_guard lock(mutex_);
  free_.clear();
  for (size_t i = events_.size(); i > 0; i--) free_.push_back(i - 1);
  filled_.clear();
  closed_ = abandoned_ = false;
  acquire_wait_ms_ = 0;
}

std::optional<size_t> SnapshotPool::acquire() {
  Stopwatch watch;
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return abandoned_ || !free_.empty(); });
  acquire_wait_ms_ += watch.millis();
  if (abandoned_) return std::nullopt;
  const size_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void SnapshotPool::fill(size_t slot, ParamRange range) {
  TANDEM_CHECK(range.size() <= slot_floats_, "snapshot pool: a piece of ", range.size(),
               " parameters in a slot of ", slot_floats_, " floats");
  {
    std::lock_guard lock(mutex_);
    filled_.push_back({slot, range});
  }
  changed_.notify_all();
}

void SnapshotPool::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}

std::optional<SnapshotPool::Piece> SnapshotPool::next() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return closed_ || !filled_.empty(); });
  if (filled_.empty()) return std::nullopt;
  const Piece piece = filled_.front();
  filled_.pop_front();
  return piece;
}

void SnapshotPool::release(size_t slot) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(slot);
  }
  changed_.notify_all();
}

void SnapshotPool::abandon() {
  {
    std::lock_guard lock(mutex_);
    abandoned_ = true;
  }
  changed_.notify_all();
}

double SnapshotPool::acquire_wait_ms() const {
  std::lock_guard lock(mutex_);
  return acquire_wait_ms_;
}

}  // namespace tandem
