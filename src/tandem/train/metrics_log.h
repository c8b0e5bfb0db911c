// Per-step metrics as JSON Lines: one object per line, each written with one append
// (a single write(2) on an O_APPEND descriptor), so a line is in the file whole or not at
// all and a reader can tail it.
//
// Opening drops a torn last line (a crash of a machine, not of the process, can leave
// one). A resumed run names the step it resumed at: the records of later steps, which it
// is about to redo, are cut from the file, so that a plot never shows two curves on top
// of each other.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

namespace tandem {

class MetricsLog {
 public:
  // An empty path disables logging. Parent directories are created.
  explicit MetricsLog(const std::filesystem::path& path,
                      std::optional<int64_t> resumed_at = std::nullopt);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  bool enabled() const { return fd_ >= 0; }
  void write(const nlohmann::json& record);

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace tandem
