// Writes one checkpoint at a time on a thread of its own, so that training goes on while
// the bytes reach the disk (lazy checkpoints: train/trainer.cc snapshots the state, this
// writes it). The write is any function that publishes a checkpoint and returns its
// directory (save_checkpoint_dir and friends: atomic, checksummed); its failure is
// reported by poll() or wait() on the training thread, never lost.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>

namespace tandem {

class BackgroundCheckpointWriter {
 public:
  struct Outcome {
    int64_t step = 0;
    std::filesystem::path path = {};  // the published checkpoint; empty on failure
    double flush_ms = 0;              // from start() to the end of the write
    std::string error = {};           // why the write failed; empty on success
  };

  BackgroundCheckpointWriter() = default;
  // Finishes the write in flight (its snapshot is consistent: finishing beats losing it).
  ~BackgroundCheckpointWriter();
  BackgroundCheckpointWriter(const BackgroundCheckpointWriter&) = delete;
  BackgroundCheckpointWriter& operator=(const BackgroundCheckpointWriter&) = delete;

  // Starts writing checkpoint `step`. One at a time: wait() for the previous one first.
  void start(int64_t step, std::function<std::filesystem::path()> write);
  // A write was started and its outcome not yet collected.
  bool in_flight() const { return thread_.joinable(); }
  // The write in flight has finished (its outcome is ready for poll or wait).
  bool finished() const { return in_flight() && done_; }
  // The outcome once the write has finished, without blocking; nullopt while it runs or
  // when none is in flight. Each outcome is returned once.
  std::optional<Outcome> poll();
  // Blocks until the write in flight has finished; its outcome (nullopt when none).
  std::optional<Outcome> wait();

 private:
  std::thread thread_;
  std::atomic<bool> done_{false};
  Outcome outcome_;  // written by the thread before done_, read after join
};

}  // namespace tandem
