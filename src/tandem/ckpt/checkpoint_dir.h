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
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class File;

// One file of a checkpoint: `write` fills `out`, the file opened for it in the staging
// directory, in order, or throws. Its bytes are checksummed as they go out, so a save never
// reads its files back.
struct CheckpointFileWriter {
  std::string file_name;
  std::function<void(File& out)> write;
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

// A file in a checkpoint: its plain name, size and XXH3-64 (16 hex digits).
struct CheckpointFileRecord {
  std::string name;
  uint64_t bytes = 0;
  std::string xxh3_64;
};

// Creates `path` and has `write` fill it, in order, checksumming its bytes as they go out;
// then fsyncs it and returns its record (no read-back). An empty file is an error: the
// writer forgot its work.
CheckpointFileRecord write_checkpoint_file(const std::filesystem::path& path,
                                           const std::function<void(File& out)>& write);

// fsyncs a file written into a staging directory by other means than a CheckpointFileWriter
// (another rank; a streamed writer) and returns its record, reading the file back for its
// checksum.
CheckpointFileRecord record_checkpoint_file(const std::filesystem::path& path);

// A checkpoint being written: "<root>/step_%08d.tmp-<pid>", filled by this process
// (write) and others sharing the filesystem (their files, synced and recorded with
// record_checkpoint_file, are added with add_written: the ranks of a data-parallel run),
// then published: the manifest (with any extra top-level keys) is written last, and the
// directory renamed into place as save_checkpoint_dir does. Destroyed unpublished, the
// staging directory is removed and nothing that existed before changes.
class StagedCheckpoint {
 public:
  StagedCheckpoint(const std::filesystem::path& checkpoints_root, int64_t step);
  ~StagedCheckpoint();
  StagedCheckpoint(const StagedCheckpoint&) = delete;
  StagedCheckpoint& operator=(const StagedCheckpoint&) = delete;

  const std::filesystem::path& dir() const { return staging_; }
  void write(const CheckpointFileWriter& file);
  void add_written(const CheckpointFileRecord& record);
  std::filesystem::path publish(const nlohmann::json& extra = nlohmann::json::object());

 private:
  void check_new_name(const std::string& name) const;
  std::filesystem::path root_, staging_;
  int64_t step_;
  std::vector<CheckpointFileRecord> files_;
  bool published_ = false;
};

// The checkpoint's manifest, validated, with any extra keys its writer added.
nlohmann::json checkpoint_manifest(const std::filesystem::path& checkpoint_dir);

// Accepts a checkpoint directory (has manifest.json), a checkpoints root (has "latest"),
// or a run directory (has "checkpoints/latest"); returns the checkpoint directory.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

// Checks the manifest and the size and checksum of every file it lists; throws
// tandem::Error naming the first bad file.
void verify_checkpoint(const std::filesystem::path& checkpoint_dir);
// The bytes of the file `name` of a checkpoint, read once: checksummed as they come in and
// held against the manifest's size and XXH3-64 before they are returned, with
// verify_checkpoint's messages (a damaged or unlisted file is refused, named).
std::vector<uint8_t> read_verified_file(const std::filesystem::path& checkpoint_dir,
                                        const std::string& name);
// The same for a reader that puts the bytes where they belong (a safetensors file read into
// place: SafetensorsFile::read_into): `read` gets the file open at its start and its size,
// reads all of it once and passes every byte to `observe`; the bytes observed are then held
// against the manifest. Where they do not match, whatever `read` filled must be dropped.
using VerifiedReader = std::function<void(File& in, uint64_t bytes,
                                          const std::function<void(const void*, size_t)>& observe)>;
void read_verified(const std::filesystem::path& checkpoint_dir, const std::string& name,
                   const VerifiedReader& read);
// The same for the listed files only (each must be in the manifest): a rank reading its
// part of a sharded checkpoint need not read every shard.
void verify_checkpoint(const std::filesystem::path& checkpoint_dir,
                       const std::vector<std::string>& only);

// The step recorded in the checkpoint's manifest.
int64_t checkpoint_step(const std::filesystem::path& checkpoint_dir);

// A checkpoint's place in its run's history, as its writer records it (this layer reads
// no format but its own, so it is told): its id, and the ids of the checkpoints of its
// timeline before it, newest first. A run resumed from an earlier checkpoint (a rollback)
// starts a timeline of its own; the checkpoints it abandoned are on another. Empty for a
// checkpoint written before lineages were recorded.
struct CheckpointLineage {
  std::string id;
  std::vector<std::string> ancestors;
};
using LineageOf = std::function<CheckpointLineage(const std::filesystem::path& checkpoint_dir)>;

// A checkpoint newest_verified_checkpoint passed over, and why (verify_checkpoint's error).
struct DamagedCheckpoint {
  std::filesystem::path dir;
  std::string why;
};

// What --resume reads. A checkpoint directory is taken as named (a damaged one is
// refused). A checkpoints root or a run directory means what "latest" names: with
// `lineage_of` and a latest that has a lineage, the newest committed checkpoint of its
// timeline that verifies in full (a descendant only when a crash came between the
// publishing rename and the pointer; then latest; then its ancestors), never one of
// another timeline, though its step be higher; without, the newest committed checkpoint
// (step_* with a manifest) that verifies. `passed_over` says which were skipped and why.
// Throws when none verifies.
struct ResumableCheckpoint {
  std::filesystem::path dir;
  std::string passed_over;                 // empty when the first choice verified
  std::vector<DamagedCheckpoint> damaged;  // the same, one by one, newest first
};
ResumableCheckpoint newest_verified_checkpoint(const std::filesystem::path& path,
                                               const LineageOf& lineage_of = {});
// The same choice for a reader of part of a checkpoint (`tandem sample` reads the weights
// and the trainer state, not the optimizer state): only the files it reads must verify.
struct CheckpointChoice {
  LineageOf lineage_of = {};
  // The files of a checkpoint directory that must verify; unset: every file.
  std::function<std::vector<std::string>(const std::filesystem::path& dir)> files_read = {};
  // For the messages: what the caller does with the checkpoint ("resume from it"), and
  // what to do when none verifies.
  std::string_view use = "resume";
  std::string_view if_none = "start afresh in another directory";
};
ResumableCheckpoint newest_verified_checkpoint(const std::filesystem::path& path,
                                               const CheckpointChoice& choice);

// After a checkpoint is committed: removes committed checkpoints beyond the newest `keep`
// (never the one "latest" names; keep 0 removes none), each renamed out of the step_*
// names before its files go, and what crashes left: staging directories of steps before
// the latest, checkpoints caught mid-removal. With `lineage_of` and a latest that has a
// lineage, it counts and removes only checkpoints of latest's timeline (another
// timeline's are left alone); without, every committed checkpoint. Returns what it
// removed.
std::vector<std::filesystem::path> prune_checkpoints(const std::filesystem::path& checkpoints_root,
                                                     int64_t keep,
                                                     const LineageOf& lineage_of = {});

// At the start of a run that holds the output directory (train/run_lock.h), so that no
// save can be under way: removes what interrupted saves left under the root (staging
// directories, checkpoints caught mid-removal, temporary files), and puts back a
// checkpoint that a crash left moved aside while it was being replaced (so that `latest`
// names a complete checkpoint again). Returns what it removed or restored. It touches only
// the exact names a save writes ("step_<digits>" or "latest" with ".tmp-", ".old-" or
// ".removing-" and a pid), and nothing when the root is a symbolic link (it would lead out
// of the run directory).
std::vector<std::filesystem::path> clean_up_interrupted_saves(
    const std::filesystem::path& checkpoints_root);

}  // namespace tandem
