#include "tandem/train/metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "tandem/core/error.h"
#include "tandem/core/file_io.h"

namespace tandem {
namespace fs = std::filesystem;

namespace {

// The complete lines of `text` to keep: all, or those of steps up to `resumed_at` (lines
// without a step, and lines that do not parse, stay).
std::string kept_lines(const std::string& text, std::optional<int64_t> resumed_at) {
  std::string out;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    const std::string_view line(text.data() + begin, end - begin + 1);
    bool keep = true;
    if (resumed_at) {
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      keep = !(record.is_object() && record.contains("step") && record["step"].is_number() &&
               record["step"].get<int64_t>() > *resumed_at);
    }
    if (keep) out += line;
  }
  return out;  // a last line without its newline is torn: dropped
}

}  // namespace

MetricsLog::MetricsLog(const fs::path& path, std::optional<int64_t> resumed_at) : path_(path) {
  if (path.empty()) return;
  std::error_code ec;
  if (path.has_parent_path()) {
    fs::create_directories(path.parent_path(), ec);
    if (ec)
      fail(path.string(), ": cannot create its directory (", ec.message(),
           "); choose another --metrics path");
  }
  if (fs::exists(path, ec)) {
    const std::string text = read_file_text(path);
    const std::string kept = kept_lines(text, resumed_at);
    if (kept.size() != text.size()) write_file_atomic(path, kept);
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail(path.string(), ": cannot open the metrics file for writing (", std::strerror(errno),
         "); choose another --metrics path");
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (fd_ < 0) return;
  const std::string line = record.dump() + "\n";
  // One write: on an O_APPEND descriptor the line lands whole. A short write (a full
  // disk) is reported rather than continued, which would split the line.
  ssize_t n;
  do {
    n = ::write(fd_, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(line.size()))
    fail(path_.string(), ": writing a metrics line failed (",
         n < 0 ? std::strerror(errno) : "short write: is the disk full?", ")");
}

}  // namespace tandem
