// A Chrome trace (Trace Event Format, opens in Perfetto or chrome://tracing): named
// lanes of timed slices, recorded from any thread while enabled.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/timer.h"

namespace tandem {

class TraceRecorder {
 public:
  TraceRecorder() = default;
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // Slices are kept only while enabled (the steps chosen for tracing).
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }
  // Microseconds since the recorder was made.
  double now_us() const { return clock_.seconds() * 1e6; }

  // One slice on `lane` (a row in the viewer), from begin_us to end_us.
  void slice(std::string_view lane, std::string name, double begin_us, double end_us,
             nlohmann::json args = nullptr);
  size_t size() const;

  // Writes {"traceEvents": [...]} atomically, lanes named and in first-use order.
  void write(const std::filesystem::path& path) const;

 private:
  struct Slice {
    int lane;
    std::string name;
    double begin_us, end_us;
    nlohmann::json args;
  };
  Stopwatch clock_;
  std::atomic<bool> enabled_ = false;  // read by every thread that records
  mutable std::mutex mutex_;
  std::map<std::string, int, std::less<>> lanes_;
  std::vector<std::string> lane_names_;
  std::vector<Slice> slices_;
};

// Times a scope as one slice (nothing when the recorder is null or disabled).
class TraceScope {
 public:
  TraceScope(TraceRecorder* recorder, std::string_view lane, std::string name)
      : recorder_(recorder != nullptr && recorder->enabled() ? recorder : nullptr),
        lane_(lane),
        name_(std::move(name)),
        begin_us_(recorder_ ? recorder_->now_us() : 0) {}
  ~TraceScope() {
    if (recorder_) recorder_->slice(lane_, std::move(name_), begin_us_, recorder_->now_us());
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  TraceRecorder* recorder_;
  std::string_view lane_;
  std::string name_;
  double begin_us_;
};

}  // namespace tandem
