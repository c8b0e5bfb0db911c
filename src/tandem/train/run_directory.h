// The run's output directory (train.output_dir), as rank 0 writes it: held for the run's
// lifetime (run_lock.h), checked before the first step, cleared of what interrupted saves
// left, and never mixed with another run's checkpoints. The methods that take a
// communicator are collectives: rank 0 decides, and all ranks stop together when it refuses.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tandem/train/run_lock.h"

namespace tandem {

class Communicator;

class RunDirectory {
 public:
  // `writes`: the run writes checkpoints there (false for benchmarks: nothing is taken).
  RunDirectory(std::filesystem::path dir, bool writes) : dir_(std::move(dir)), writes_(writes) {}

  const std::filesystem::path& path() const { return dir_; }
  std::filesystem::path checkpoints() const { return dir_ / "checkpoints"; }

  // Takes the directory (one run per directory) and checks that a checkpoint of
  // `checkpoint_bytes` fits its disk and that `trace`, unless empty, can be written.
  void take(Communicator& comm, uint64_t checkpoint_bytes, const std::filesystem::path& trace);
  // A fresh run refuses a directory that holds an earlier run's checkpoints.
  void refuse_an_earlier_run(Communicator& comm) const;
  // Holding the directory, rank 0 knows no save is under way: what one left is debris
  // (clean_up_interrupted_saves touches only the names a save writes). Returns what was
  // removed (rank 0's list).
  std::vector<std::filesystem::path> clean_up_leftovers(Communicator& comm);
  // A resumed run refuses a directory that holds the checkpoints of another run than
  // `resumed`'s.
  void refuse_another_run(const std::filesystem::path& resumed) const;
  // Before each checkpoint: the directory is still the one taken (run_lock.h).
  void check_still_held() const {
    if (lock_) lock_->check_still_held();
  }
  // What a run that ends at `step` without its last checkpoint has on disk, and what it
  // lost, in words.
  std::string lost_steps_text(int64_t step) const;

 private:
  std::filesystem::path dir_;
  bool writes_;
  std::unique_ptr<RunDirectoryLock> lock_;  // rank 0's, once taken
};

}  // namespace tandem
