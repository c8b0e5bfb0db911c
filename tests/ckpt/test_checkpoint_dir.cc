// Checkpoint directories: publish by rename, manifest checksums, the "latest" pointer,
// and what survives a writer that fails halfway.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/ckpt/checkpoint_dir.h"
#include "tandem/core/checksum.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace {
namespace fs = std::filesystem;

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    base_ = fs::temp_directory_path() / cat("tandem_test_ckpt_", ::getpid(), "_", info->name());
    fs::remove_all(base_);
    run_ = base_ / "run";
    root_ = run_ / "checkpoints";
  }
  void TearDown() override { fs::remove_all(base_); }

  // Everything in the checkpoints root, by name.
  std::set<std::string> root_entries() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(root_)) names.insert(e.path().filename());
    return names;
  }

  fs::path base_, run_, root_;
};

using testing::error_of;

CheckpointFileWriter text_file(std::string name, std::string content) {
  return {name, [content](File& out) { out.write_all(content); }};
}

// A writer in pieces: the checksum of the pieces is the file's.
CheckpointFileWriter plain_file(std::string name, std::string content) {
  return {name, [content](File& out) {
            for (char c : content) out.write_all(&c, 1);
          }};
}

struct WriterFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes part of its file, then fails, as a writer hitting a full disk would.
CheckpointFileWriter failing_file(std::string name) {
  return {name, [](File& out) {
            out.write_all("partial");
            throw WriterFailed("disk full");
          }};
}

TEST_F(CheckpointDirTest, SavesVerifiesAndResolves) {
  const fs::path dir = save_checkpoint_dir(
      root_, 500, {text_file("model.safetensors", "weights"), plain_file("state.json", "{}\n")});
  EXPECT_EQ(dir, root_ / "step_00000500");
  EXPECT_EQ(read_file_text(dir / "model.safetensors"), "weights");
  EXPECT_EQ(read_file_text(dir / "state.json"), "{}\n");
  EXPECT_EQ(read_file_text(root_ / "latest"), "step_00000500\n");
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000500"}));

  const nlohmann::json manifest = nlohmann::json::parse(read_file_text(dir / "manifest.json"));
  EXPECT_EQ(manifest["format"], "tandem-checkpoint");
  EXPECT_EQ(manifest["version"], 1);
  EXPECT_EQ(manifest["step"], 500);
  ASSERT_EQ(manifest["files"].size(), 2u);
  EXPECT_EQ(manifest["files"]["model.safetensors"]["bytes"], 7);
  EXPECT_EQ(manifest["files"]["model.safetensors"]["xxh3_64"],
            checksum_hex(checksum64("weights", 7)));
  EXPECT_EQ(manifest["files"]["state.json"]["xxh3_64"], checksum_hex(checksum64("{}\n", 3)));

  verify_checkpoint(dir);
  EXPECT_EQ(checkpoint_step(dir), 500);
  EXPECT_EQ(resolve_checkpoint(dir), dir);
  EXPECT_EQ(resolve_checkpoint(root_), dir);
  EXPECT_EQ(resolve_checkpoint(run_), dir);

  // A later save moves "latest"; the earlier checkpoint stays.
  const fs::path later = save_checkpoint_dir(root_, 1000, {text_file("model.safetensors", "w2")});
  EXPECT_EQ(later, root_ / "step_00001000");
  EXPECT_EQ(read_file_text(root_ / "latest"), "step_00001000\n");
  EXPECT_EQ(resolve_checkpoint(run_), later);
  EXPECT_EQ(checkpoint_step(resolve_checkpoint(root_)), 1000);
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000500", "step_00001000"}));
  verify_checkpoint(dir);
}

TEST_F(CheckpointDirTest, VerifyNamesTheDamagedFile) {
  const fs::path dir = save_checkpoint_dir(
      root_, 7, {text_file("model.safetensors", "0123456789"), text_file("optim.bin", "abc")});
  const fs::path model = dir / "model.safetensors";
  const std::string good_hash = checksum_hex(checksum64("0123456789", 10));

  // One flipped byte, same size: only the checksum can tell.
  write_file_atomic(model, std::string("0123456780"));
  EXPECT_EQ(error_of([&] { verify_checkpoint(dir); }),
            model.string() + ": checksum mismatch (manifest says " + good_hash + ", file has " +
                checksum_hex(checksum64("0123456780", 10)) +
                "); the file is corrupted or was modified — use another checkpoint");

  write_file_atomic(model, std::string("01234"));
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }),
                  model.string() + ": size is 5 bytes (manifest says 10)");

  fs::remove(model);
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }),
                  model.string() + ": missing (listed in manifest.json)");
  write_file_atomic(model, std::string("0123456789"));
  verify_checkpoint(dir);

  const fs::path manifest = dir / "manifest.json";
  const std::string original = read_file_text(manifest);
  write_file_atomic(manifest, std::string("{\"format\": "));
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }),
                  manifest.string() + ": not valid JSON");
  write_file_atomic(manifest,
                    std::string(R"({"format": "other", "version": 1, "step": 7, "files": {}})"));
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }),
                  manifest.string() + ": \"format\" is \"other\", expected \"tandem-checkpoint\"");
  write_file_atomic(
      manifest,
      std::string(R"({"format": "tandem-checkpoint", "version": 2, "step": 7, "files": {}})"));
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }),
                  manifest.string() + ": unsupported version 2");
  const std::string head = R"({"format": "tandem-checkpoint", "version": 1, "step": 7, )";
  write_file_atomic(manifest,
                    head + R"("files": {"../x": {"bytes": 1, "xxh3_64": "0000000000000000"}}})");
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }), "invalid file name '../x'");
  write_file_atomic(manifest, head + R"("files": {"optim.bin": {"bytes": 3}}})");
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }), "entry for 'optim.bin' is");
  fs::remove(manifest);
  EXPECT_CONTAINS(error_of([&] { verify_checkpoint(dir); }), manifest.string() + ": missing");
  EXPECT_CONTAINS(error_of([&] { checkpoint_step(dir); }), manifest.string() + ": missing");
  write_file_atomic(manifest, original);
  verify_checkpoint(dir);
}

TEST_F(CheckpointDirTest, FailingWriterLeavesEverythingAsItWas) {
  const fs::path dir = save_checkpoint_dir(root_, 100, {text_file("model.safetensors", "v1")});

  // A new step whose second file fails: no staging directory, "latest" unchanged.
  EXPECT_THROW(save_checkpoint_dir(
                   root_, 200, {text_file("model.safetensors", "v2"), failing_file("optim.bin")}),
               WriterFailed);
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000100"}));
  EXPECT_EQ(read_file_text(root_ / "latest"), "step_00000100\n");

  // The same step failing: the existing checkpoint keeps its old contents.
  EXPECT_THROW(save_checkpoint_dir(root_, 100, {failing_file("model.safetensors")}), WriterFailed);
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000100"}));
  EXPECT_EQ(read_file_text(dir / "model.safetensors"), "v1");
  verify_checkpoint(dir);
  EXPECT_EQ(resolve_checkpoint(run_), dir);

  // A writer that "succeeds" without writing its file is an error too.
  const CheckpointFileWriter lazy{"model.safetensors", [](File&) {}};
  EXPECT_CONTAINS(error_of([&] { save_checkpoint_dir(root_, 300, {lazy}); }),
                  "returned without writing anything");
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000100"}));
}

TEST_F(CheckpointDirTest, SavingTheSameStepTwiceReplacesIt) {
  save_checkpoint_dir(
      root_, 100,
      {text_file("model.safetensors", "first"), text_file("extra.bin", "only in the first")});
  const fs::path dir = save_checkpoint_dir(root_, 100, {text_file("model.safetensors", "second")});
  EXPECT_EQ(read_file_text(dir / "model.safetensors"), "second");
  EXPECT_FALSE(fs::exists(dir / "extra.bin"));
  verify_checkpoint(dir);
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000100"}));
}

TEST_F(CheckpointDirTest, RejectsBadArgumentsAndUnresolvablePaths) {
  EXPECT_CONTAINS(error_of([&] { save_checkpoint_dir(root_, 1, {text_file("a/b", "x")}); }),
                  "invalid checkpoint file name 'a/b'");
  EXPECT_CONTAINS(
      error_of([&] { save_checkpoint_dir(root_, 1, {text_file("manifest.json", "x")}); }),
      "invalid checkpoint file name 'manifest.json'");
  EXPECT_CONTAINS(error_of([&] {
                    save_checkpoint_dir(root_, 1, {text_file("a", "x"), text_file("a", "y")});
                  }),
                  "'a' is listed twice");
  EXPECT_CONTAINS(error_of([&] { save_checkpoint_dir(root_, -1, {}); }), "negative step -1");

  EXPECT_EQ(error_of([&] { resolve_checkpoint(base_ / "nowhere"); }),
            (base_ / "nowhere").string() + ": no such file or directory");
  fs::create_directories(base_ / "empty");
  EXPECT_EQ(error_of([&] { resolve_checkpoint(base_ / "empty"); }),
            (base_ / "empty").string() +
                ": not a checkpoint; looked for manifest.json (a checkpoint directory), latest (a "
                "checkpoints root) and checkpoints/latest (a run directory)");
  fs::create_directories(root_);
  write_file_atomic(root_ / "latest", std::string("step_00000042\n"));
  EXPECT_CONTAINS(error_of([&] { resolve_checkpoint(run_); }),
                  (root_ / "latest").string() + ": points to 'step_00000042', but");
}

// --resume of a run directory: the newest committed checkpoint that verifies, also when a
// crash came before `latest` moved to it; damaged newer ones are passed over, saying why;
// a checkpoint directory named on its own is taken or refused, never replaced.
TEST_F(CheckpointDirTest, ResumeFallsBackToTheNewestCheckpointThatVerifies) {
  for (int64_t step : {10, 20, 30})
    save_checkpoint_dir(root_, step, {text_file("model.safetensors", cat("weights ", step))});
  EXPECT_EQ(newest_verified_checkpoint(run_).dir, root_ / "step_00000030");
  EXPECT_EQ(newest_verified_checkpoint(run_).passed_over, "");

  // Committed (manifest and all) but `latest` not yet moved: it counts.
  write_file_atomic(root_ / "latest", std::string("step_00000020\n"));
  EXPECT_EQ(newest_verified_checkpoint(root_).dir, root_ / "step_00000030");

  write_file_atomic(root_ / "step_00000030" / "model.safetensors", std::string("damaged!"));
  const ResumableCheckpoint chosen = newest_verified_checkpoint(run_);
  EXPECT_EQ(chosen.dir, root_ / "step_00000020");
  EXPECT_CONTAINS(chosen.passed_over, (root_ / "step_00000030" / "model.safetensors").string());
  const std::string named = error_of([&] { newest_verified_checkpoint(root_ / "step_00000030"); });
  EXPECT_CONTAINS(named, "model.safetensors: size is 8 bytes");
  // ... and the message names the intact one beside it.
  EXPECT_CONTAINS(named, "; " + (root_ / "step_00000020").string() +
                             " (step 20) verifies: resume from it, or from the run directory");

  // Staging directories and half-removed checkpoints are not candidates.
  fs::create_directories(root_ / "step_00000040.tmp-1");
  fs::create_directories(root_ / "step_00000050.removing-1");
  write_file_atomic(root_ / "step_00000050.removing-1" / "manifest.json", std::string("{}"));
  EXPECT_EQ(newest_verified_checkpoint(run_).dir, root_ / "step_00000020");

  for (int64_t step : {10, 20}) fs::remove_all(root_ / checkpoint_dir_name(step));
  EXPECT_CONTAINS(error_of([&] { newest_verified_checkpoint(run_); }), "no checkpoint verifies (");
}

TEST_F(CheckpointDirTest, PruningKeepsTheNewestAndLatestAndClearsWhatCrashesLeft) {
  for (int64_t step : {1, 2, 3, 4})
    save_checkpoint_dir(root_, step, {text_file("model.safetensors", "w")});
  fs::create_directories(root_ / "step_00000002.tmp-99");  // abandoned: older than latest
  fs::create_directories(root_ / "step_00000009.tmp-99");  // may be a writer at work
  fs::create_directories(root_ / "step_00000001.removing-99");
  EXPECT_EQ(prune_checkpoints(root_, 0).size(), 2u);  // keep 0: only the crash leftovers
  EXPECT_EQ(root_entries(),
            (std::set<std::string>{"latest", "step_00000001", "step_00000002", "step_00000003",
                                   "step_00000004", "step_00000009.tmp-99"}));
  prune_checkpoints(root_, 2);
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000003", "step_00000004",
                                                   "step_00000009.tmp-99"}));
  // `latest` is kept whatever its age.
  write_file_atomic(root_ / "latest", std::string("step_00000003\n"));
  prune_checkpoints(root_, 1);
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000003", "step_00000004",
                                                   "step_00000009.tmp-99"}));
}

// At the start of a run (no save under way): every leftover of an interrupted save goes,
// and a checkpoint moved aside while its step was being replaced comes back, so that
// `latest` names a complete checkpoint again.
TEST_F(CheckpointDirTest, AStartClearsWhatInterruptedSavesLeftAndRestoresAMovedCheckpoint) {
  for (int64_t step : {1, 2})
    save_checkpoint_dir(root_, step, {text_file("model.safetensors", "w")});
  // A crash between publish's two renames: step 2 moved aside, its replacement not in place.
  fs::rename(root_ / "step_00000002", root_ / "step_00000002.old-77");
  EXPECT_CONTAINS(error_of([&] { resolve_checkpoint(root_); }), "does not exist");
  fs::create_directories(root_ / "step_00000003.tmp-77");
  fs::create_directories(root_ / "step_00000001.removing-77");
  write_file_atomic(root_ / "latest.tmp-77", std::string("step_0000000"));
  save_checkpoint_dir(root_ / ".." / "other", 1, {text_file("model.safetensors", "w")});
  fs::rename(root_ / ".." / "other" / "step_00000001", root_ / "step_00000001.old-78");

  EXPECT_EQ(clean_up_interrupted_saves(root_).size(), 5u);
  EXPECT_EQ(root_entries(), (std::set<std::string>{"latest", "step_00000001", "step_00000002"}));
  EXPECT_EQ(resolve_checkpoint(root_), root_ / "step_00000002");
  verify_checkpoint(root_ / "step_00000002");
  EXPECT_TRUE(clean_up_interrupted_saves(root_).empty());
  EXPECT_TRUE(clean_up_interrupted_saves(base_ / "nowhere").empty());
}

// Names that merely contain a save's markers are not a save's: a user's files and folders
// stay, whatever cleaning up and pruning do; and nothing is removed through a root that is
// a link out of the run directory.
TEST_F(CheckpointDirTest, OnlyTheNamesASaveWritesAreEverRemoved) {
  for (int64_t step : {1, 2, 3})
    save_checkpoint_dir(root_, step, {text_file("model.safetensors", "w")});
  const std::set<std::string> users = {"model.old-v1.pt",         "draft.tmp-notes",
                                       "step_00000002.tmp-notes", "latest.old-x",
                                       "notes.removing-7",        "step_1.tmp-"};
  for (const std::string& name : users) write_file_atomic(root_ / name, std::string("mine"));
  fs::create_directories(root_ / "dataset.tmp-copy" / "inside");
  fs::create_directories(root_ / "step_00000004.tmp-12");  // a save's: goes
  EXPECT_EQ(clean_up_interrupted_saves(root_),
            std::vector<fs::path>{root_ / "step_00000004.tmp-12"});
  prune_checkpoints(root_, 1);
  std::set<std::string> expected = users;
  expected.insert({"latest", "step_00000003", "dataset.tmp-copy"});
  EXPECT_EQ(root_entries(), expected);
  for (const std::string& name : users) EXPECT_EQ(read_file_text(root_ / name), "mine") << name;
  EXPECT_TRUE(fs::exists(root_ / "dataset.tmp-copy" / "inside"));

  const fs::path elsewhere = base_ / "elsewhere";
  fs::create_directories(elsewhere / "step_00000007.tmp-5");
  const fs::path linked = base_ / "linked_root";
  fs::create_directory_symlink(elsewhere, linked);
  EXPECT_TRUE(clean_up_interrupted_saves(linked).empty());
  EXPECT_TRUE(fs::exists(elsewhere / "step_00000007.tmp-5")) << "removed through a link";
  // Nor does the pruning after each checkpoint, though a committed checkpoint there makes the
  // staging directory of an earlier step look abandoned.
  fs::create_directories(elsewhere / "step_00000008");
  fs::create_directories(elsewhere / "step_00000009");
  write_file_atomic(elsewhere / "step_00000008" / "manifest.json", std::string("{}"));
  write_file_atomic(elsewhere / "step_00000009" / "manifest.json", std::string("{}"));
  write_file_atomic(elsewhere / "latest", std::string("step_00000009\n"));
  EXPECT_TRUE(prune_checkpoints(linked, 1).empty());
  EXPECT_TRUE(fs::exists(elsewhere / "step_00000007.tmp-5")) << "pruned through a link";
  EXPECT_TRUE(fs::exists(elsewhere / "step_00000008")) << "pruned through a link";
}

}  // namespace
}  // namespace tandem
