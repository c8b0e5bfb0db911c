// resize_on_huge_pages is resize with a hint: the same elements whatever the kernel does
// with the hint (fresh storage value-initialised, what was there kept), and the hint itself
// is harmless on any range. populate_pages commits memory (the cpu device's allocations,
// as a GPU's are committed) without changing a byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <new>
#include <vector>

#include "tandem/core/huge_pages.h"

namespace tandem {
namespace {

TEST(HugePages, ResizingKeepsTheElementsAndZeroesTheNewOnes) {
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  const size_t n = size_t{6} << 20;  // 24 MiB: whole huge pages inside
  resize_on_huge_pages(v, n);
  ASSERT_EQ(v.size(), n);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[2], 3.0f);
  size_t nonzero = 0;
  for (size_t i = 3; i < n; i++) nonzero += v[i] != 0.0f;
  EXPECT_EQ(nonzero, 0u);
  resize_on_huge_pages(v, 10);  // shrinking: as resize
  EXPECT_EQ(v.size(), 10u);
  std::vector<uint8_t> small(100, 7);
  advise_huge_pages(small.data(), small.size());  // no whole huge page: nothing happens
  EXPECT_EQ(small[99], 7);
}

// Resident memory of this process, from /proc/self/statm (pages).
size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST(HugePages, PopulatingCommitsThePagesAndKeepsTheirBytes) {
  const size_t bytes = size_t{64} << 20;
  void* raw = ::operator new (bytes, std::align_val_t{64});
  auto* data = static_cast<uint8_t*>(raw);
  data[12345] = 42;  // one page touched before
  const size_t before = resident_bytes();
  populate_pages(data, bytes);
  const size_t after = resident_bytes();
  EXPECT_GE(after, before + bytes - (size_t{8} << 20)) << before << " -> " << after;
  EXPECT_EQ(data[12345], 42);
  populate_pages(data + 1, 10);  // within one page, unaligned: nothing breaks
  populate_pages(data, 0);
  EXPECT_EQ(data[12345], 42);
  ::operator delete (raw, std::align_val_t{64});
}

}  // namespace
}  // namespace tandem
