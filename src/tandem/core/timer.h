// Wall-clock timing for metrics and progress.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace tandem {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void reset() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double millis() const { return seconds() * 1e3; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// The median of measured values (of an even count, the mean of the middle two); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Runs `work` once to warm up (caches, page faults, lazy initialisation), then
// `repetitions` more times, and returns the seconds of each of those.
template <typename Work>
std::vector<double> timed_passes(int repetitions, Work&& work) {
  std::vector<double> seconds;
  for (int pass = 0; pass <= repetitions; pass++) {
    Stopwatch watch;
    work();
    if (pass > 0) seconds.push_back(watch.seconds());
  }
  return seconds;
}

// The fastest of the timed passes: the figure least disturbed by other load on a shared
// machine.
template <typename Work>
double best_seconds(int repetitions, Work&& work) {
  const std::vector<double> seconds = timed_passes(repetitions, work);
  return *std::min_element(seconds.begin(), seconds.end());
}

// Their median: what the work typically takes on a shared machine, the figure a
// prediction of real runs wants.
template <typename Work>
double median_seconds(int repetitions, Work&& work) {
  return median(timed_passes(repetitions, work));
}

}  // namespace tandem
