#include "tandem/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "tandem/core/error.h"

namespace tandem {
namespace fs = std::filesystem;

RunDirectoryLock::RunDirectoryLock(const fs::path& output_dir) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec)
    fail("train.output_dir '", output_dir.string(), "': cannot create it (", ec.message(),
         "); choose another with --set train.output_dir=DIR");
  const fs::path path = output_dir / ".tandem.lock";
  path_ = path;
  // Never through a link: writing the pid into whatever a link names would truncate a
  // file outside the run directory.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0 && errno == ELOOP)
    fail(path.string(),
         ": is a symbolic link; tandem follows no links when it writes in a "
         "run directory: remove it (tandem makes its own lock file)");
  if (fd_ < 0 && errno == EISDIR)
    fail(path.string(), ": is not a regular file; remove it (tandem makes its own lock file)");
  if (fd_ < 0)
    fail(path.string(), ": cannot open (", std::strerror(errno),
         "); is train.output_dir writable?");
  struct stat st = {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(path.string(), ": is not a regular file; remove it (tandem makes its own lock file)");
  }
  // A hard link is a name of a file elsewhere too: writing the pid would truncate it.
  if (st.st_nlink > 1) {
    ::close(fd_);
    fd_ = -1;
    fail(path.string(), ": has ", st.st_nlink,
         " names (hard links), so it is also a file outside the run directory; tandem writes "
         "only files of its own there: remove it (tandem makes its own lock file)");
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK) {
      std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "unknown";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      fail("train.output_dir '", output_dir.string(), "' is in use by another tandem run (pid ",
           pid, "); wait for it to end, or write elsewhere with --set train.output_dir=DIR");
    }
    fail(path.string(), ": cannot lock (", std::strerror(error), ")");
  }
  // The holder's pid, for the message of the run that is refused.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    fail(path.string(), ": cannot write (", std::strerror(error), "); is the disk full?");
  }
}

void RunDirectoryLock::check_still_held() const {
  struct stat held = {}, now = {};
  const bool same = ::fstat(fd_, &held) == 0 && ::lstat(path_.c_str(), &now) == 0 &&
                    held.st_dev == now.st_dev && held.st_ino == now.st_ino;
  TANDEM_CHECK(same, "train.output_dir '", path_.parent_path().string(),
               "' was removed or replaced while this run held it (", path_.string(),
               " is no longer its lock file), and another run may be writing there now; this "
               "run stops rather than write beside it. Its earlier checkpoints went with the "
               "directory; rerun, or resume from a copy, into a directory of its own");
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace tandem
