// One run per output directory (train/run_lock.h): a second run into a directory that a
// live run holds is refused naming the holder's pid; a holder that is SIGKILLed leaves no
// stale lock.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/train/run_lock.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

TEST(RunDirectoryLock, ASecondRunIntoAHeldDirectoryIsRefusedNamingTheHolder) {
  testing::ScratchDir dir("run_lock");
  testing::write_small_corpus(dir / "data.txt");
  const TrainConfig config =
      parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "run"));
  TrainOptions quiet;
  quiet.show_progress = false;
  {
    const RunDirectoryLock held(dir / "run");
    const std::string error = testing::error_of([&] { train(config, quiet); });
    EXPECT_CONTAINS(error, "train.output_dir '" + (dir / "run").string() +
                               "' is in use by another tandem run (pid " +
                               std::to_string(::getpid()) + ")");
    EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints")) << "nothing written";
    EXPECT_CONTAINS(testing::error_of([&] { RunDirectoryLock again(dir / "run"); }),
                    "is in use by another tandem run");
  }
  // Released: the run goes ahead, and holds the directory while it runs.
  EXPECT_EQ(train(config, quiet).steps_done, 20);
  const RunDirectoryLock after(dir / "run");
}

TEST(RunDirectoryLock, AKilledHolderLeavesNoStaleLock) {
  testing::ScratchDir dir("run_lock_kill");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const RunDirectoryLock held(dir / "run");
    ::pause();
    ::_exit(0);
  }
  // Until the child holds it (its pid in the file).
  const std::string pid = std::to_string(child) + "\n";
  for (int i = 0; i < 5000; i++) {
    std::error_code ec;
    if (fs::exists(dir / "run" / ".tandem.lock", ec) &&
        read_file_text(dir / "run" / ".tandem.lock") == pid)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_CONTAINS(testing::error_of([&] { RunDirectoryLock mine(dir / "run"); }),
                  "(pid " + std::to_string(child) + ")");
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  const RunDirectoryLock mine(dir / "run");  // the kernel released the child's lock
}

// The lock file is never a link or anything but a regular file: a link's target outside the
// run directory is not truncated, and the run is refused saying what to remove.
TEST(RunDirectoryLock, ALockFileThatIsALinkOrNotAFileIsRefusedAndLeftAlone) {
  testing::ScratchDir dir("run_lock_link");
  fs::create_directories(dir / "run");
  write_file_atomic(dir / "outside.txt", std::string("precious\n"));
  fs::create_symlink(dir / "outside.txt", dir / "run" / ".tandem.lock");
  EXPECT_CONTAINS(testing::error_of([&] { RunDirectoryLock lock(dir / "run"); }),
                  ".tandem.lock: is a symbolic link");
  EXPECT_EQ(read_file_text(dir / "outside.txt"), "precious\n");
  fs::create_directories(dir / "run2" / ".tandem.lock");
  EXPECT_CONTAINS(testing::error_of([&] { RunDirectoryLock lock(dir / "run2"); }),
                  ".tandem.lock: is not a regular file");
}

// A lock file that is a hard link to a file elsewhere would have that file truncated and
// overwritten with the pid: refused, and the file left as it was.
TEST(RunDirectoryLock, ALockFileWithSeveralNamesIsRefusedAndLeftAlone) {
  testing::ScratchDir dir("run_lock_hard_link");
  fs::create_directories(dir / "run");
  write_file_atomic(dir / "outside.txt", std::string("precious\n"));
  fs::create_hard_link(dir / "outside.txt", dir / "run" / ".tandem.lock");
  EXPECT_CONTAINS(testing::error_of([&] { RunDirectoryLock lock(dir / "run"); }),
                  ".tandem.lock: has 2 names (hard links)");
  EXPECT_EQ(read_file_text(dir / "outside.txt"), "precious\n");
}

// The start's checks of paths: a NUL byte in output_dir is refused before the disk is
// touched; checkpoints/ that is a file is found at the start, not at the first checkpoint;
// a start refused after it made the directory leaves nothing behind.
TEST(RunDirectoryLock, BadPathsAreRefusedAtTheStartAndLeaveNothing) {
  testing::ScratchDir dir("run_paths");
  testing::write_small_corpus(dir / "data.txt");
  nlohmann::json with_nul = testing::tiny_run_config(dir / "data.txt", dir / "run");
  with_nul["train"]["output_dir"] = (dir / "cut").string() + std::string(1, '\0') + "tail";
  EXPECT_CONTAINS(testing::error_of([&] { parse_train_config(with_nul); }),
                  "train.output_dir holds a NUL byte");
  EXPECT_FALSE(fs::exists(dir / "cut"));

  const TrainConfig config =
      parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "run"));
  fs::create_directories(dir / "run");
  write_file_atomic(dir / "run" / "checkpoints", std::string("not a directory\n"));
  EXPECT_CONTAINS(testing::error_of([&] { train(config, testing::quiet()); }),
                  "checkpoints is not a directory");

  // Refused after the lock is taken (a --trace that is a directory): the directories this
  // start made go again, and one that was there stays.
  const TrainConfig fresh =
      parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "new" / "deeper"));
  TrainOptions bad_trace = testing::quiet();
  bad_trace.trace_path = dir.path();
  EXPECT_CONTAINS(testing::error_of([&] { train(fresh, bad_trace); }), "--trace");
  EXPECT_FALSE(fs::exists(dir / "new"));
  fs::create_directories(dir / "kept");
  const TrainConfig existing =
      parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "kept"));
  EXPECT_CONTAINS(testing::error_of([&] { train(existing, bad_trace); }), "--trace");
  EXPECT_TRUE(fs::exists(dir / "kept"));
}

// A live run's directory removed (and taken by another run) is noticed: the lock file at
// its path is no longer the one held.
TEST(RunDirectoryLock, ARemovedOrReplacedDirectoryIsNoticed) {
  testing::ScratchDir dir("run_lock_removed");
  const RunDirectoryLock held(dir / "run");
  held.check_still_held();
  fs::remove_all(dir / "run");
  EXPECT_CONTAINS(testing::error_of([&] { held.check_still_held(); }),
                  "' was removed or replaced while this run held it");
  const RunDirectoryLock other(dir / "run");  // a second run takes the new directory
  EXPECT_CONTAINS(testing::error_of([&] { held.check_still_held(); }),
                  "another run may be writing there now");
  other.check_still_held();
}

// A fresh run refused because the directory holds an earlier run's checkpoints touches
// nothing there, not even what an interrupted save left.
TEST(RunDirectoryLock, ARefusedRunCleansNothingUp) {
  testing::ScratchDir dir("run_lock_refused");
  testing::write_small_corpus(dir / "data.txt");
  const TrainConfig config =
      parse_train_config(testing::tiny_run_config(dir / "data.txt", dir / "run"));
  TrainOptions quiet;
  quiet.show_progress = false;
  train(config, quiet);
  const fs::path debris = dir / "run" / "checkpoints" / "step_00000099.tmp-4242";
  fs::create_directories(debris);
  EXPECT_CONTAINS(testing::error_of([&] { train(config, quiet); }),
                  "already holds checkpoints of an earlier run");
  EXPECT_TRUE(fs::exists(debris));
}

}  // namespace
}  // namespace tandem
