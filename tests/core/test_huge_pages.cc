// resize_on_huge_pages is resize with a hint: the same elements whatever the kernel does
// with the hint (fresh storage value-initialised, what was there kept), and the hint itself
// is harmless on any range.
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace
}  // namespace tandem
