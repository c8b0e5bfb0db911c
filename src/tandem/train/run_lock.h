// One run per output directory: the run that writes into train.output_dir holds an
// advisory lock (flock) on "<output_dir>/.tandem.lock" for its lifetime, with its pid in
// the file. A second run into the same directory is refused at start, naming the holder.
// The kernel releases the lock when the holder exits, however it exits, so a SIGKILLed
// run never leaves a stale lock behind (the file stays; only the lock matters).
#pragma once

#include <filesystem>

namespace tandem {

class RunDirectoryLock {
 public:
  // Creates the directory if needed and takes the lock, or throws tandem::Error naming
  // the directory and the pid that holds it.
  explicit RunDirectoryLock(const std::filesystem::path& output_dir);
  ~RunDirectoryLock();  // releases it
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  // Throws when the lock file at the directory's path is no longer the one held: the
  // directory was removed (`rm -rf` of a live run) or replaced, and another run may have
  // taken it since. The trainer asks before each checkpoint, so that two runs never write
  // into one directory.
  void check_still_held() const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace tandem
