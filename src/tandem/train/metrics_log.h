// Per-step metrics as JSON Lines: one object per line, appended and flushed as it is
// written, so a crash loses at most the line being written and a reader can tail it.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "tandem/core/file_io.h"

namespace tandem {

class MetricsLog {
 public:
  // An empty path disables logging. Parent directories are created.
  explicit MetricsLog(const std::filesystem::path& path);
  bool enabled() const { return file_ != nullptr; }
  void write(const nlohmann::json& record);

 private:
  std::unique_ptr<File> file_;
};

}  // namespace tandem
