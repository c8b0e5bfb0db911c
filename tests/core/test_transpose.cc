// core/transpose.h against the definition, out[c - c0][r] = in[r][c], on shapes that leave
// every kind of edge: smaller than a block, multiples of the 8 x 8 blocks and of the 32 x 32
// tiles, and ragged in either dimension; over the whole matrix and over bands of its columns.
#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "tandem/core/transpose.h"

namespace tandem {
namespace {

TEST(Transpose, EveryElementLandsWhereTheDefinitionPutsIt) {
  for (const auto& [rows, cols] : std::vector<std::tuple<int64_t, int64_t>>{
           {1, 1}, {3, 5}, {8, 8}, {32, 32}, {64, 96}, {37, 70}, {128, 9}, {9, 128}, {100, 1}}) {
    std::vector<float> in(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < in.size(); i++) in[i] = static_cast<float>(i) + 0.5f;
    for (const auto& [c0, c1] : std::vector<std::tuple<int64_t, int64_t>>{
             {0, cols}, {0, (cols + 1) / 2}, {cols / 3, cols}, {cols / 2, cols / 2 + 1}}) {
      if (c0 >= c1) continue;
      std::vector<float> out(static_cast<size_t>((c1 - c0) * rows), -1.0f);
      transpose_rows(in.data(), rows, cols, c0, c1, out.data());
      for (int64_t c = c0; c < c1; c++)
        for (int64_t r = 0; r < rows; r++)
          ASSERT_EQ(out[(c - c0) * rows + r], in[r * cols + c])
              << rows << " x " << cols << ", columns [" << c0 << ", " << c1 << "), element (" << r
              << ", " << c << ")";
    }
  }
}

}  // namespace
}  // namespace tandem
