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

}  // namespace

void RunDirectory::take(Communicator& comm, uint64_t checkpoint_bytes, const fs::path& trace) {
  std::string error;
  if (comm.rank() == 0) {
    try {
      if (writes_) {
        lock_ = std::make_unique<RunDirectoryLock>(dir_);
        check_free_space(dir_, checkpoint_bytes, "one checkpoint of this model");
      }
      if (!trace.empty()) check_writable_file(trace, "--trace");
    } catch (const Error& e) {
      error = e.what();
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
