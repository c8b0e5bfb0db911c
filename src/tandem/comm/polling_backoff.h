// How a rank waits for other ranks (messages, a stream) without burning a core the
// training threads need, and without sleeping through a fast exchange: after the start or
// the last progress it polls back to back, yielding the core, for kSpin; then it sleeps
// kFirstPause between polls until kShortWaits have passed, then pauses doubling up to
// kLongestPause. The deadline is the communicator's timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace tandem {

class PollingBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kSpin = std::chrono::microseconds(50);
  static constexpr auto kFirstPause = std::chrono::microseconds(50);
  static constexpr auto kShortWaits = std::chrono::microseconds(2000);
  static constexpr auto kLongestPause = std::chrono::microseconds(1000);

  explicit PollingBackoff(std::chrono::milliseconds timeout)
      : start_(Clock::now()), last_progress_(start_), deadline_(start_ + timeout) {}

  // Whether the deadline has passed.
  bool expired() const { return Clock::now() >= deadline_; }
  // Something completed: back to polling back to back.
  void progressed() {
    last_progress_ = Clock::now();
    pause_ = kFirstPause;
  }
  // Waits a little before the next poll (never past the deadline).
  void pause() {
    const Clock::time_point now = Clock::now();
    if (now - last_progress_ < kSpin) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause_, deadline_ - now));
    if (now - last_progress_ >= kShortWaits) pause_ = std::min(2 * pause_, kLongestPause);
  }

 private:
  Clock::time_point start_, last_progress_, deadline_;
  std::chrono::microseconds pause_ = kFirstPause;
};

}  // namespace tandem
