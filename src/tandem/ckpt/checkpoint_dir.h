// Checkpoint directories: a checkpoint is a directory of files plus a manifest with
// each file's size and XXH3-64, published with renames so that a crash never leaves a
// half-written checkpoint where a resume would pick it up.
//
//   runs/x/checkpoints/
//     latest                  "step_00000500\n", replaced atomically after each save
//     step_00000500/
//       manifest.json         {"format": "tandem-checkpoint", "version": 1, "step": 500,
//                              "files": {"model.safetensors": {"bytes": n, "xxh3_64": "..."}}}
//       model.safetensors ...
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tandem {

// One file of a checkpoint: `write` must create the file at `where` (a path inside a
// staging directory) or throw.
struct CheckpointFileWriter {
  std::string file_name;
  std::function<void(const std::filesystem::path& where)> write;
};

// "step_00000500"
std::string checkpoint_dir_name(int64_t step);

// Writes every file into "<root>/step_%08d.tmp-<pid>", adds manifest.json, fsyncs, and
// renames the staging directory to "<root>/step_%08d" (replacing an existing one only
// once the new one is complete), then points "<root>/latest" at it. If a writer throws,
// the staging directory is removed, nothing that existed before changes, and the
// exception propagates. Returns the final checkpoint directory.
std::filesystem::path save_checkpoint_dir(const std::filesystem::path& checkpoints_root,
                                          int64_t step,
                                          const std::vector<CheckpointFileWriter>& files);

// Accepts a checkpoint directory (has manifest.json), a checkpoints root (has "latest"),
// or a run directory (has "checkpoints/latest"); returns the checkpoint directory.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

// Checks the manifest and the size and checksum of every file it lists; throws
// tandem::Error naming the first bad file.
void verify_checkpoint(const std::filesystem::path& checkpoint_dir);

// The step recorded in the checkpoint's manifest.
int64_t checkpoint_step(const std::filesystem::path& checkpoint_dir);

}  // namespace tandem
