#include "tandem/train/preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "tandem/core/error.h"
#include "tandem/core/format.h"

namespace tandem {
namespace fs = std::filesystem;

void check_free_space(const fs::path& dir, uint64_t needed, const std::string& what) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (ec) return;  // a filesystem that cannot say: the writes will tell
  TANDEM_CHECK(space.available >= needed, dir.string(), ": ", format_bytes(space.available),
               " free, but ", what, " takes ", format_bytes(needed),
               "; free some space or choose another train.output_dir");
}

void check_writable_file(const fs::path& path, const std::string& option) {
  std::error_code ec;
  if (path.has_parent_path()) {
    fs::create_directories(path.parent_path(), ec);
    if (ec) fail(option, " ", path.string(), ": cannot create its directory (", ec.message(), ")");
  }
  TANDEM_CHECK(!fs::is_directory(path, ec), option, " ", path.string(),
               ": is a directory; name a file");
  const bool existed = fs::exists(path, ec);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail(option, " ", path.string(), ": cannot write (", std::strerror(errno), ")");
  ::close(fd);
  if (!existed) fs::remove(path, ec);
}

}  // namespace tandem
