#include "tandem/train/metrics_log.h"

namespace tandem {

MetricsLog::MetricsLog(const std::filesystem::path& path) {
  if (path.empty()) return;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  file_ = std::make_unique<File>(path, "ab");
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!file_) return;
  file_->write_all(record.dump() + "\n");
  file_->flush();
}

}  // namespace tandem
