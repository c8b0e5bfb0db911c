#include "tandem/core/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace tandem {

size_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  size_t bytes = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  // A container's limit is what the run may really use ("max" means none).
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  std::string limit;
  if (cgroup >> limit && limit != "max") {
    try {
      const size_t cap = std::stoull(limit);
      if (cap > 0) bytes = bytes == 0 ? cap : std::min(bytes, cap);
    } catch (const std::exception&) {
      // Unreadable: the physical memory stands.
    }
  }
  return bytes;
}

}  // namespace tandem
