#include "tandem/core/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>

namespace tandem {

void advise_huge_pages(void* data, size_t bytes) {
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + bytes) & ~(kHugePage - 1);
  if (first >= last) return;
  // Failure (no THP in this kernel, EINVAL) leaves ordinary pages: nothing to report.
  (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

void populate_pages(void* data, size_t bytes) {
  if (bytes == 0) return;
  constexpr uintptr_t kPage = 4096;
  const auto begin = reinterpret_cast<uintptr_t>(data) & ~(kPage - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
#ifdef MADV_POPULATE_WRITE
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
#endif
  // A kernel before 5.14: a write to each page faults it in (its bytes are the allocator's
  // to give, so one zero written back over itself changes nothing).
  auto* first = static_cast<volatile uint8_t*>(data);
  for (uintptr_t page = begin; page < end; page += kPage) {
    const uintptr_t at = std::max(page, reinterpret_cast<uintptr_t>(data));
    volatile uint8_t& byte = first[at - reinterpret_cast<uintptr_t>(data)];
    byte = byte;
  }
}

}  // namespace tandem
