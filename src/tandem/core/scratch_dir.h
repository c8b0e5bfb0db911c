// Scratch space for whatever writes files it does not keep (the benchmarks, the tests): a
// directory removed with everything in it, and the bytes a directory's files hold.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem {

// `path`, emptied now and removed with everything in it when this goes; a bare name goes
// under the system's temporary directory.
class ScratchDir {
 public:
  explicit ScratchDir(const std::filesystem::path& path)
      : path_(path.has_parent_path() ? path : std::filesystem::temp_directory_path() / path) {
    std::filesystem::remove_all(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The bytes of the regular files directly in `dir`.
inline uint64_t directory_bytes(const std::filesystem::path& dir) {
  uint64_t bytes = 0;
  for (const std::filesystem::directory_entry& entry : std::filesystem::directory_iterator(dir))
    if (entry.is_regular_file()) bytes += entry.file_size();
  return bytes;
}

}  // namespace tandem
