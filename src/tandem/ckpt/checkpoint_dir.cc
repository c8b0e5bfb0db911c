#include "tandem/ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "tandem/core/checksum.h"
#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr char kManifestName[] = "manifest.json";
constexpr char kLatestName[] = "latest";
constexpr char kFormat[] = "tandem-checkpoint";
constexpr int64_t kVersion = 1;

// File names in a checkpoint are plain names: a manifest must not be able to point a
// verifier (or a writer) outside its directory.
bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// Writers may use plain buffered files; fsync them here so that the manifest never
// describes bytes that are still only in the page cache.
void sync_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(path.string(), ": cannot open to sync (", std::strerror(errno), ")");
  const int rc = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  if (rc != 0) fail(path.string(), ": fsync failed (", std::strerror(saved_errno), ")");
}

void rename_or_fail(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) fail(from.string(), ": cannot rename to ", to.string(), " (", ec.message(), ")");
}

struct ManifestFile {
  std::string name;
  uint64_t bytes;
  std::string xxh3_64;
};

struct Manifest {
  int64_t step;
  std::vector<ManifestFile> files;
};

const json* find_key(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

bool is_hex16(const std::string& text) {
  if (text.size() != 16) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Manifest read_manifest(const fs::path& checkpoint_dir) {
  const fs::path path = checkpoint_dir / kManifestName;
  const std::string where = path.string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail(where, ": missing; is ", checkpoint_dir.string(),
         " a tandem checkpoint directory? (a save that crashed leaves no manifest)");
  json m;
  try {
    m = json::parse(read_file_text(path));
  } catch (const json::parse_error& e) {
    fail(where, ": not valid JSON (error at byte ", e.byte,
         "); the manifest is corrupted — use another checkpoint");
  }
  if (!m.is_object()) fail(where, ": not a JSON object; is this a tandem checkpoint manifest?");

  const json* format = find_key(m, "format");
  if (format == nullptr || !format->is_string() || format->get<std::string>() != kFormat)
    fail(where, ": \"format\" is ", format ? format->dump() : "missing", ", expected \"", kFormat,
         "\"; is this a tandem checkpoint?");
  const json* version = find_key(m, "version");
  if (version == nullptr || !version->is_number_integer())
    fail(where, ": \"version\" is ", version ? version->dump() : "missing", ", expected ",
         kVersion);
  if (version->get<int64_t>() != kVersion)
    fail(where, ": unsupported version ", version->dump(), " (this tandem reads version ", kVersion,
         "); was it written by a newer tandem?");
  const json* step = find_key(m, "step");
  if (step == nullptr || !step->is_number_unsigned() ||
      step->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(where, ": \"step\" is ", step ? step->dump() : "missing", ", expected a step number >= 0");

  Manifest manifest{step->get<int64_t>(), {}};
  const json* files = find_key(m, "files");
  if (files == nullptr || !files->is_object())
    fail(where, ": \"files\" is ", files ? files->dump() : "missing", ", expected an object");
  for (const auto& [name, entry] : files->items()) {
    if (!is_plain_name(name) || name == kManifestName)
      fail(where, ": lists an invalid file name '", name, "'; the manifest is corrupted");
    const json* bytes = entry.is_object() ? find_key(entry, "bytes") : nullptr;
    const json* hash = entry.is_object() ? find_key(entry, "xxh3_64") : nullptr;
    if (bytes == nullptr || !bytes->is_number_unsigned() || hash == nullptr || !hash->is_string() ||
        !is_hex16(hash->get<std::string>()))
      fail(where, ": entry for '", name, "' is ", entry.dump(),
           ", expected {\"bytes\": n, \"xxh3_64\": \"16 hex digits\"}");
    manifest.files.push_back(ManifestFile{name, bytes->get<uint64_t>(), hash->get<std::string>()});
  }
  return manifest;
}

// The checkpoint directory named by "<root>/latest", or an error naming the pointer.
fs::path follow_latest(const fs::path& root) {
  const fs::path latest = root / kLatestName;
  std::string name = read_file_text(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  if (!is_plain_name(name))
    fail(latest.string(), ": does not hold a checkpoint directory name (found \"", name,
         "\"); the file is corrupted — name a checkpoint directory instead");
  const fs::path dir = root / name;
  std::error_code ec;
  if (!fs::is_regular_file(dir / kManifestName, ec))
    fail(latest.string(), ": points to '", name, "', but ", (dir / kManifestName).string(),
         " does not exist; name another checkpoint directory instead");
  return dir;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return name;
}

CheckpointFileRecord write_checkpoint_file(const fs::path& path,
                                           const std::function<void(File& out)>& write) {
  File out(path, "wb");
  out.checksum_writes();
  out.write_behind();  // the disk writes while the writer makes the next bytes
  write(out);
  TANDEM_CHECK(out.bytes_written() > 0, path.string(),
               ": the writer returned without writing anything");
  out.sync();
  out.close();
  return {path.filename().string(), out.bytes_written(), checksum_hex(out.written_checksum())};
}

CheckpointFileRecord record_checkpoint_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail(path.string(), ": the writer returned without creating it");
  sync_file(path);
  const uint64_t bytes = fs::file_size(path, ec);
  if (ec) fail(path.string(), ": cannot read its size (", ec.message(), ")");
  return {path.filename().string(), bytes, checksum_hex(checksum64_file(path))};
}

StagedCheckpoint::StagedCheckpoint(const fs::path& checkpoints_root, int64_t step)
    : root_(checkpoints_root), step_(step) {
  const std::string root_text = checkpoints_root.string();
  TANDEM_CHECK(step >= 0, root_text, ": cannot save a checkpoint for negative step ", step);
  std::error_code ec;
  fs::create_directories(checkpoints_root, ec);
  if (ec) fail(root_text, ": cannot create the checkpoints directory (", ec.message(), ")");
  const std::string name = checkpoint_dir_name(step);
  staging_ = checkpoints_root / (name + ".tmp-" + std::to_string(::getpid()));
  // A staging directory with our pid is debris from a crashed process that had the same
  // pid (containers reuse small pids); it was never published, so it is safe to drop.
  fs::remove_all(staging_, ec);
  if (ec) fail(staging_.string(), ": cannot remove a stale staging directory (", ec.message(), ")");
  if (!fs::create_directory(staging_, ec) || ec)
    fail(staging_.string(), ": cannot create the staging directory (",
         ec ? ec.message() : "it already exists", ")");
}

StagedCheckpoint::~StagedCheckpoint() {
  if (published_) return;
  std::error_code ignored;
  fs::remove_all(staging_, ignored);
}

void StagedCheckpoint::check_new_name(const std::string& name) const {
  TANDEM_CHECK(is_plain_name(name) && name != kManifestName, root_.string(),
               ": invalid checkpoint file name '", name,
               "' (must be a plain name other than manifest.json)");
  for (const CheckpointFileRecord& f : files_)
    TANDEM_CHECK(f.name != name, root_.string(), ": checkpoint file '", name, "' is listed twice");
}

void StagedCheckpoint::write(const CheckpointFileWriter& file) {
  check_new_name(file.file_name);
  TANDEM_CHECK(static_cast<bool>(file.write), root_.string(), ": checkpoint file '", file.file_name,
               "' has no writer");
  files_.push_back(write_checkpoint_file(staging_ / file.file_name, file.write));
}

void StagedCheckpoint::add_written(const CheckpointFileRecord& record) {
  check_new_name(record.name);
  TANDEM_CHECK(is_hex16(record.xxh3_64), root_.string(), ": checkpoint file '", record.name,
               "' has no valid checksum");
  files_.push_back(record);
}

fs::path StagedCheckpoint::publish(const nlohmann::json& extra) {
  TANDEM_CHECK(!published_, staging_.string(), ": already published");
  nlohmann::ordered_json manifest = nlohmann::ordered_json::object();
  manifest["format"] = kFormat;
  manifest["version"] = kVersion;
  manifest["step"] = step_;
  manifest["files"] = nlohmann::ordered_json::object();
  for (const CheckpointFileRecord& f : files_)
    manifest["files"][f.name] = {{"bytes", f.bytes}, {"xxh3_64", f.xxh3_64}};
  if (extra.is_object())
    for (const auto& [key, value] : extra.items()) {
      TANDEM_CHECK(!manifest.contains(key), "checkpoint manifest: extra key '", key,
                   "' would replace a standard one");
      manifest[key] = value;
    }
  write_file_atomic(staging_ / kManifestName, manifest.dump(2) + "\n");
  sync_directory(staging_);

  // Publish. An existing checkpoint for this step is moved aside, not deleted, until the
  // new one is in place, so a failure here never leaves the step without a checkpoint.
  const std::string name = checkpoint_dir_name(step_);
  const fs::path final_dir = root_ / name;
  const fs::path old_dir = root_ / (name + ".old-" + std::to_string(::getpid()));
  std::error_code ec, old_removal;
  if (fs::exists(final_dir, ec)) {
    fs::remove_all(old_dir, ec);
    rename_or_fail(final_dir, old_dir);
    fs::rename(staging_, final_dir, ec);
    if (ec) {
      std::error_code ignored;
      fs::rename(old_dir, final_dir, ignored);
      fail(staging_.string(), ": cannot rename to ", final_dir.string(), " (", ec.message(), ")");
    }
    published_ = true;
    sync_directory(root_);
    fs::remove_all(old_dir, old_removal);
  } else {
    rename_or_fail(staging_, final_dir);
    published_ = true;
    sync_directory(root_);
  }
  write_file_atomic(root_ / kLatestName, name + "\n");
  if (old_removal)
    fail(old_dir.string(), ": cannot remove the replaced checkpoint (", old_removal.message(),
         "); the new one is in place, delete this directory by hand");
  return final_dir;
}

fs::path save_checkpoint_dir(const fs::path& checkpoints_root, int64_t step,
                             const std::vector<CheckpointFileWriter>& files) {
  // A bad name or a missing writer throws from write(): the staging directory goes with
  // `staged`, and nothing that existed before changes.
  StagedCheckpoint staged(checkpoints_root, step);
  for (const CheckpointFileWriter& f : files) staged.write(f);
  return staged.publish();
}

nlohmann::json checkpoint_manifest(const fs::path& checkpoint_dir) {
  read_manifest(checkpoint_dir);  // validated
  return nlohmann::json::parse(read_file_text(checkpoint_dir / kManifestName));
}

fs::path resolve_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path.string(), ": no such file or directory");
  if (fs::is_regular_file(path / kManifestName, ec)) return path;
  if (fs::is_regular_file(path / kLatestName, ec)) return follow_latest(path);
  if (fs::is_regular_file(path / "checkpoints" / kLatestName, ec))
    return follow_latest(path / "checkpoints");
  fail(path.string(), ": not a checkpoint; looked for ", kManifestName,
       " (a checkpoint directory), ", kLatestName, " (a checkpoints root) and checkpoints/",
       kLatestName, " (a run directory)");
}

void verify_checkpoint(const fs::path& checkpoint_dir) { verify_checkpoint(checkpoint_dir, {}); }

namespace {

const ManifestFile& listed_file(const fs::path& checkpoint_dir, const Manifest& manifest,
                                const std::string& name) {
  for (const ManifestFile& f : manifest.files)
    if (f.name == name) return f;
  fail((checkpoint_dir / kManifestName).string(), ": does not list '", name,
       "'; the checkpoint is incomplete — use another checkpoint");
}

// The file's size against the manifest's, before anything is read.
uint64_t checked_size(const fs::path& path, const ManifestFile& f) {
  const std::string where = path.string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    fail(where, ": missing (listed in ", kManifestName,
         "); the checkpoint is incomplete — use another checkpoint");
  const uint64_t bytes = fs::file_size(path, ec);
  if (ec) fail(where, ": cannot read its size (", ec.message(), ")");
  if (bytes != f.bytes)
    fail(where, ": size is ", bytes, " bytes (manifest says ", f.bytes,
         "); the file is truncated or was modified — use another checkpoint");
  return bytes;
}

void check_checksum(const fs::path& path, const ManifestFile& f, uint64_t checksum) {
  const std::string actual = checksum_hex(checksum);
  if (actual != f.xxh3_64)
    fail(path.string(), ": checksum mismatch (manifest says ", f.xxh3_64, ", file has ", actual,
         "); the file is corrupted or was modified — use another checkpoint");
}

}  // namespace

void verify_checkpoint(const fs::path& checkpoint_dir, const std::vector<std::string>& only) {
  const Manifest manifest = read_manifest(checkpoint_dir);
  for (const std::string& name : only) listed_file(checkpoint_dir, manifest, name);
  for (const ManifestFile& f : manifest.files) {
    if (!only.empty() && std::find(only.begin(), only.end(), f.name) == only.end()) continue;
    const fs::path path = checkpoint_dir / f.name;
    checked_size(path, f);
    check_checksum(path, f, checksum64_file(path));
  }
}

void read_verified(const fs::path& checkpoint_dir, const std::string& name,
                   const VerifiedReader& read) {
  const Manifest manifest = read_manifest(checkpoint_dir);
  const ManifestFile& f = listed_file(checkpoint_dir, manifest, name);
  const fs::path path = checkpoint_dir / name;
  const uint64_t bytes = checked_size(path, f);
  File file(path, "rb");
  Checksum64Stream checksum;
  uint64_t observed = 0;
  read(file, bytes, [&](const void* data, size_t n) {
    checksum.update(data, n);
    observed += n;
  });
  TANDEM_CHECK(observed == bytes, path.string(), ": the reader passed ", observed, " of its ",
               bytes, " bytes to the checksum");
  check_checksum(path, f, checksum.digest());
}

std::vector<uint8_t> read_verified_file(const fs::path& checkpoint_dir, const std::string& name) {
  std::vector<uint8_t> bytes;
  read_verified(checkpoint_dir, name, [&bytes](File& in, uint64_t size, const auto& observe) {
    bytes.resize(size);
    in.read_observed(bytes.data(), bytes.size(), observe);
  });
  return bytes;
}

int64_t checkpoint_step(const fs::path& checkpoint_dir) {
  return read_manifest(checkpoint_dir).step;
}

namespace {

// What a name under a checkpoints root is: a committed checkpoint "step_%08d", or what a
// save leaves on its way (a `.tmp-<pid>` staging directory or temporary file, a replaced
// checkpoint moved aside as `.old-<pid>`, an old one being removed as `.removing-<pid>`).
enum class EntryKind { kOther, kCheckpoint, kStaging, kMovedAside, kRemoving };
struct RootEntry {
  EntryKind kind = EntryKind::kOther;
  int64_t step = -1;  // of a "step_%08d" name, with or without a suffix; -1 otherwise
  std::string base;   // the name without its suffix
};

bool all_digits(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
}

// Only the exact names a save writes: "step_<digits>", "latest", either followed by one of
// the markers and a pid. Anything else under the root (a user's "model.old-v1.pt",
// "draft.tmp-notes") is kOther, which nothing here renames or removes.
RootEntry classify(const std::string& name) {
  RootEntry entry{.base = name};
  for (const auto& [marker, kind] :
       {std::pair{std::string_view(".tmp-"), EntryKind::kStaging},
        std::pair{std::string_view(".old-"), EntryKind::kMovedAside},
        std::pair{std::string_view(".removing-"), EntryKind::kRemoving}}) {
    const size_t at = name.rfind(marker);
    if (at == std::string::npos || !all_digits(std::string_view(name).substr(at + marker.size())))
      continue;
    entry.kind = kind;
    entry.base = name.substr(0, at);
    break;
  }
  constexpr std::string_view kPrefix = "step_";
  const std::string& base = entry.base;
  if (base.rfind(kPrefix, 0) == 0 && all_digits(std::string_view(base).substr(kPrefix.size()))) {
    entry.step = std::stoll(base.substr(kPrefix.size()));
    if (entry.kind == EntryKind::kOther) entry.kind = EntryKind::kCheckpoint;
  } else if (base != kLatestName) {
    return {.base = name};  // not a name a save writes
  }
  return entry;
}

// Committed checkpoint directories under the root (named step_N, with a manifest),
// newest first.
std::vector<std::pair<int64_t, fs::path>> committed_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const RootEntry name = classify(entry.path().filename().string());
    std::error_code file_ec;
    if (name.kind == EntryKind::kCheckpoint &&
        fs::is_regular_file(entry.path() / kManifestName, file_ec))
      found.emplace_back(name.step, entry.path());
  }
  if (ec) fail(root.string(), ": cannot list the checkpoints (", ec.message(), ")");
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  return found;
}

// The committed checkpoints of latest's timeline, newest first: its descendants (newer
// only after a crash between the publishing rename and the pointer), latest, its
// ancestors. Empty when there is no latest or it has no lineage: then every committed one.
std::vector<std::pair<int64_t, fs::path>> timeline_of_latest(
    const fs::path& root, const std::vector<std::pair<int64_t, fs::path>>& committed,
    const LineageOf& lineage_of) {
  std::vector<std::pair<int64_t, fs::path>> timeline;
  if (!lineage_of) return committed;
  fs::path latest;
  CheckpointLineage of_latest;
  try {
    latest = follow_latest(root);
    of_latest = lineage_of(latest);
  } catch (const Error&) {
    return committed;  // no latest, or one that cannot say: the newest that verifies
  }
  if (of_latest.id.empty()) return committed;
  const auto has = [](const std::vector<std::string>& ids, const std::string& id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  for (const auto& [step, dir] : committed) {
    CheckpointLineage of;
    try {
      of = lineage_of(dir);
    } catch (const Error&) {
      continue;  // unreadable: not shown to be of the timeline
    }
    if (dir == latest || has(of.ancestors, of_latest.id) ||
        (!of.id.empty() && has(of_latest.ancestors, of.id)))
      timeline.emplace_back(step, dir);
  }
  return timeline;
}

}  // namespace

ResumableCheckpoint newest_verified_checkpoint(const fs::path& path, const LineageOf& lineage_of) {
  return newest_verified_checkpoint(path, CheckpointChoice{.lineage_of = lineage_of});
}

ResumableCheckpoint newest_verified_checkpoint(const fs::path& path,
                                               const CheckpointChoice& choice) {
  const auto verify = [&choice](const fs::path& dir) {
    if (choice.files_read)
      verify_checkpoint(dir, choice.files_read(dir));
    else
      verify_checkpoint(dir);
  };
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path.string(), ": no such file or directory");
  if (fs::is_regular_file(path / kManifestName, ec)) {
    try {
      verify(path);
    } catch (const Error& e) {
      // Named on its own, it is never replaced by another; but the message names the one
      // beside it that would do.
      std::string instead;
      for (const auto& [step, dir] : committed_checkpoints(path.parent_path())) {
        if (dir == path) continue;
        try {
          verify(dir);
          instead = cat("; ", dir.string(), " (step ", step, ") verifies: ", choice.use,
                        " from it, or from the run directory");
          break;
        } catch (const Error&) {
        }
      }
      fail(e.what(), instead);
    }
    return {path, "", {}};
  }
  // A run directory, or a checkpoints root (with or without its "latest": one deleted by
  // hand still leaves the committed checkpoints to choose from).
  const fs::path root =
      !fs::is_regular_file(path / kLatestName, ec) && fs::is_directory(path / "checkpoints", ec)
          ? path / "checkpoints"
          : path;
  // Newest first. A step directory is committed once it has its manifest (written last,
  // before the rename that publishes it), so it counts even when a crash came before
  // `latest` was moved to it.
  const std::vector<std::pair<int64_t, fs::path>> candidates =
      timeline_of_latest(root, committed_checkpoints(root), choice.lineage_of);
  if (candidates.empty() && !fs::is_regular_file(root / kLatestName, ec))
    resolve_checkpoint(path);  // throws, saying what was looked for
  ResumableCheckpoint chosen;
  for (const auto& [step, dir] : candidates) {
    try {
      verify(dir);
      chosen.dir = dir;
      return chosen;
    } catch (const Error& e) {
      chosen.passed_over += (chosen.passed_over.empty() ? "" : "; ") + std::string(e.what());
      chosen.damaged.push_back({dir, e.what()});
    }
  }
  fail(path.string(), ": no checkpoint verifies (",
       chosen.passed_over.empty() ? "none found" : chosen.passed_over, "); ", choice.if_none);
}

std::vector<fs::path> prune_checkpoints(const fs::path& root, int64_t keep,
                                        const LineageOf& lineage_of) {
  std::vector<fs::path> removed;
  // A root that is a link leads out of the run directory: nothing there is the run's to
  // remove (as clean_up_interrupted_saves).
  std::error_code link_ec;
  if (fs::is_symlink(root, link_ec)) return removed;
  fs::path latest;
  try {
    latest = follow_latest(root);
  } catch (const Error&) {
    return removed;  // nothing committed to measure "older" against
  }
  const int64_t latest_step = classify(latest.filename().string()).step;
  std::error_code ec;
  if (keep > 0) {
    int64_t kept = 0;
    for (const auto& [step, dir] :
         timeline_of_latest(root, committed_checkpoints(root), lineage_of)) {
      if (dir == latest || kept < keep) {
        kept++;
        continue;
      }
      // Renamed out of the step_* names first: removing files one by one, a crash would
      // otherwise leave a directory with a manifest and missing files, which would look
      // like a committed checkpoint.
      const fs::path doomed = fs::path(dir).concat(".removing-" + std::to_string(::getpid()));
      rename_or_fail(dir, doomed);
      fs::remove_all(doomed, ec);
      if (ec) fail(doomed.string(), ": cannot remove an old checkpoint (", ec.message(), ")");
      removed.push_back(dir);
    }
  }
  // Left by a crash: staging directories of steps before the latest, and checkpoints
  // caught halfway through their removal.
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const RootEntry name = classify(entry.path().filename().string());
    const bool abandoned =
        name.kind == EntryKind::kStaging && name.step >= 0 && name.step < latest_step;
    if (!abandoned && name.kind != EntryKind::kRemoving) continue;
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
    if (!remove_ec) removed.push_back(entry.path());
  }
  return removed;
}

std::vector<fs::path> clean_up_interrupted_saves(const fs::path& root) {
  std::vector<fs::path> touched;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return touched;
  // A root that is a link leads out of the run directory: nothing there is the run's to
  // remove.
  if (fs::is_symlink(root, ec)) return touched;
  std::vector<fs::path> entries;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec))
    entries.push_back(entry.path());
  if (ec) fail(root.string(), ": cannot list the checkpoints (", ec.message(), ")");
  for (const fs::path& path : entries) {
    const RootEntry name = classify(path.filename().string());
    if (name.kind == EntryKind::kMovedAside && name.step >= 0) {
      // Moved aside by StagedCheckpoint::publish while its step was being replaced: back
      // into place if the replacement never arrived.
      const fs::path original = root / name.base;
      std::error_code exists_ec;
      if (!fs::exists(original, exists_ec) &&
          fs::is_regular_file(path / kManifestName, exists_ec)) {
        rename_or_fail(path, original);
        sync_directory(root);
        touched.push_back(original);
        continue;
      }
    }
    if (name.kind == EntryKind::kOther || name.kind == EntryKind::kCheckpoint) continue;
    std::error_code remove_ec;
    fs::remove_all(path, remove_ec);
    if (remove_ec)
      fail(path.string(), ": cannot remove what an interrupted save left (", remove_ec.message(),
           "); delete it by hand");
    touched.push_back(path);
  }
  return touched;
}

}  // namespace tandem
