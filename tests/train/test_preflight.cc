// Before the first step (train/preflight.h): a disk too small for one checkpoint and an
// unwritable --trace or --metrics file stop the run at once, naming the numbers or the
// path; `tandem plan` compares the plan's host memory with the machine's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "support/tiny_run.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"
#include "tandem/core/host_memory.h"
#include "tandem/train/preflight.h"
#include "tandem/train/trainer.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Preflight, ADiskTooSmallForOneCheckpointIsNamedWithBothNumbers) {
  testing::ScratchDir dir("preflight_space");
  EXPECT_NO_THROW(check_free_space(dir.path(), 1, "one checkpoint of this model"));
  try {
    check_free_space(dir.path(), uint64_t{1} << 62, "one checkpoint of this model");
    ADD_FAILURE() << "4 EiB free?";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), " free, but one checkpoint of this model takes ");
    EXPECT_CONTAINS(e.what(), "choose another train.output_dir");
  }
}

TEST(Preflight, AFileThatCannotBeWrittenIsNamedAndACheckLeavesNothing) {
  testing::ScratchDir dir("preflight_files");
  write_file_atomic(dir / "plain", "x");
  EXPECT_CONTAINS(
      error_of([&] { check_writable_file(dir / "plain" / "trace.json", "--trace"); }),
      "--trace " + (dir / "plain" / "trace.json").string() + ": cannot create its directory");
  EXPECT_CONTAINS(error_of([&] { check_writable_file(dir.path(), "--trace"); }),
                  "is a directory; name a file");
  check_writable_file(dir / "new" / "trace.json", "--trace");
  EXPECT_FALSE(fs::exists(dir / "new" / "trace.json"));
}

TEST(Preflight, TrainStopsBeforeTheFirstStepAndPlanComparesWithTheMachine) {
  testing::ScratchDir dir("preflight_cli");
  testing::write_small_corpus(dir / "data.txt");
  write_file_atomic(dir / "config.json",
                    testing::tiny_run_config(dir / "data.txt", dir / "run").dump());
  const std::string tandem = testing::tandem_binary().string();
  const std::string config = (dir / "config.json").string();
  for (const std::string& option :
       {"--trace " + dir.path().string(), "--metrics " + (dir / "data.txt" / "m.jsonl").string()}) {
    const testing::CommandResult result =
        testing::run_command(tandem + " train --config " + config + " " + option + " 2>&1");
    EXPECT_NE(result.exit_code, 0) << option;
    EXPECT_CONTAINS(result.output, "tandem: error: ");
    EXPECT_EQ(result.output.find("step 1"), std::string::npos) << "trained first: " << option;
    EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints")) << option;
  }
  if (host_memory_bytes() == 0) GTEST_SKIP() << "this machine does not say its memory";
  const testing::CommandResult plan =
      testing::run_command(tandem + " plan --config " + config + " 2>&1");
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_CONTAINS(plan.output, "  machine:     ");
  EXPECT_CONTAINS(plan.output, " of host memory; the plan takes ");
}

TEST(Preflight, AnOutputDirectoryThatCannotBeWrittenStopsTheRunAtOnce) {
  testing::ScratchDir dir("preflight_output");
  testing::write_small_corpus(dir / "data.txt");
  write_file_atomic(dir / "plain", "x");
  std::vector<fs::path> unwritable = {dir / "plain" / "run"};  // under a file
  if (::geteuid() != 0) {
    // Root writes into read-only directories anyway: only others can check this one.
    fs::create_directories(dir / "readonly");
    fs::permissions(dir / "readonly", fs::perms::owner_read | fs::perms::owner_exec);
    unwritable.push_back(dir / "readonly");
  } else {
    std::printf("[ note ] running as root: a read-only output directory is not checked\n");
  }
  for (const fs::path& output : unwritable) {
    TrainOptions options;
    options.show_progress = false;
    std::string error;
    try {
      train(parse_train_config(testing::tiny_run_config(dir / "data.txt", output)), options);
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_CONTAINS(error, output.string()) << output;
    EXPECT_CONTAINS(error, "cannot") << output;
  }
  if (::geteuid() != 0) fs::permissions(dir / "readonly", fs::perms::owner_all);
}

}  // namespace
}  // namespace tandem
