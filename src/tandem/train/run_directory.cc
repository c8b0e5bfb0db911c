#include "tandem/train/run_directory.h"

#include <system_error>

#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/comm/agreement.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/error.h"
#include "tandem/train/preflight.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

constexpr const char* kRank0Refused = "rank 0 refused to start (its error says why)";

// The first of `dir` and its parents that does not exist (what create_directories makes), or
// nothing when `dir` exists.
fs::path first_missing(const fs::path& dir) {
  std::error_code ec;
  fs::path missing;
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing = p;
    if (p == p.parent_path()) break;
  }
  return missing;
}

// Takes away what a refused start made: the lock file, then each directory it created, from
// `dir` up to `created`, as long as it is empty.
void remove_what_start_made(const fs::path& dir, const fs::path& created) {
  std::error_code ec;
  fs::remove(dir / ".tandem.lock", ec);
  for (fs::path p = fs::absolute(dir, ec);; p = p.parent_path()) {
    if (!fs::is_empty(p, ec) || ec || !fs::remove(p, ec)) return;
    if (p == created || p == p.parent_path()) return;
  }
}

}  // namespace

void RunDirectory::take(Communicator& comm, uint64_t checkpoint_bytes, const fs::path& trace) {
  std::string error;
  if (comm.rank() == 0) {
    const fs::path created = writes_ ? first_missing(dir_) : fs::path();
    try {
      if (writes_) {
        lock_ = std::make_unique<RunDirectoryLock>(dir_);
        std::error_code ec;
        const fs::file_status root = fs::symlink_status(checkpoints(), ec);
        TANDEM_CHECK(!fs::exists(root) || fs::is_directory(fs::status(checkpoints(), ec)),
                     checkpoints().string(),
                     " is not a directory; the run's checkpoints go there: move it away, or "
                     "write elsewhere with --set train.output_dir=DIR");
        check_free_space(dir_, checkpoint_bytes, "one checkpoint of this model");
      }
      if (!trace.empty()) check_writable_file(trace, "--trace");
    } catch (const Error& e) {
      error = e.what();
      // A directory this start created holds nothing of anyone's: it goes again.
      if (lock_ && !created.empty()) {
        lock_.reset();
        remove_what_start_made(dir_, created);
      }
    }
  }
  fail_together(comm, error, kRank0Refused);
}

void RunDirectory::refuse_an_earlier_run(Communicator& comm) const {
  const bool fresh = comm.rank() != 0 || !writes_ || !fs::exists(checkpoints() / "latest");
  fail_together(comm,
                fresh ? std::string()
                      : cat("train.output_dir '", dir_.string(),
                            "' already holds checkpoints of an earlier run; resume it with "
                            "--resume ",
                            dir_.string(),
                            ", or start afresh in another directory with --set "
                            "train.output_dir=DIR"),
                kRank0Refused);
}

std::vector<fs::path> RunDirectory::clean_up_leftovers(Communicator& comm) {
  std::string error;
  std::vector<fs::path> cleaned;
  if (lock_) {
    try {
      cleaned = clean_up_interrupted_saves(checkpoints());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  fail_together(comm, error, kRank0Refused);
  return cleaned;
}

void RunDirectory::refuse_another_run(const fs::path& resumed) const {
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(checkpoints(), ec);
  TANDEM_CHECK(!writes_ || !fs::exists(root / "latest", ec) ||
                   fs::weakly_canonical(resumed, ec).parent_path() == root,
               "train.output_dir '", dir_.string(), "' holds the checkpoints of another run than ",
               resumed.string(),
               "; resuming into it would mix the two (and train.keep_checkpoints could remove "
               "the other's); resume into the checkpoint's own run directory (leave out --set "
               "train.output_dir) or into an empty one");
}

std::string RunDirectory::lost_steps_text(int64_t step) const {
  try {
    const fs::path newest = resolve_checkpoint(checkpoints());
    return cat("steps ", checkpoint_step(newest) + 1, "-", step,
               " exist nowhere on disk; the newest checkpoint is ", newest.string(), " (--resume ",
               dir_.string(), " continues from it)");
  } catch (const Error&) {
    return cat("no checkpoint of this run is on disk, so none of its ", step, " steps is");
  }
}

}  // namespace tandem
