#include "tandem/dist/tree_sum.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tandem/core/error.h"

namespace tandem {

namespace {

// Elements summed per pass: the partial sums of one pass stay in cache.
constexpr size_t kChunk = 512;

}  // namespace

void tree_sum(const float* const* parts, int count, size_t n, float* out) {
  TANDEM_CHECK(count >= 1, "tree_sum: needs at least one part, got ", count);
  if (count == 1) {
    if (out != parts[0]) std::memmove(out, parts[0], n * sizeof(float));
    return;
  }
  // The values of one level of the tree, for one chunk of elements: value j at j * length.
  const int first_width = (count + 1) / 2;
  std::vector<float> level(static_cast<size_t>(first_width) * std::min(n, kChunk));
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t length = std::min(kChunk, n - begin);
    // The first level, from the parts: neighbours added, an odd last part moved up.
    for (int j = 0; j < count / 2; j++) {
      const float* left = parts[2 * j] + begin;
      const float* right = parts[2 * j + 1] + begin;
      float* sum = level.data() + j * length;
      for (size_t i = 0; i < length; i++) sum[i] = left[i] + right[i];
    }
    if (count % 2 == 1) {
      std::memcpy(level.data() + (count / 2) * length, parts[count - 1] + begin,
                  length * sizeof(float));
    }
    // The next levels in place: value j of a level overwrites value j of the one below,
    // which has already been read (j <= 2j).
    for (int width = first_width; width > 1; width = (width + 1) / 2) {
      for (int j = 0; j < width / 2; j++) {
        const float* left = level.data() + 2 * j * length;
        const float* right = left + length;
        float* sum = level.data() + j * length;
        for (size_t i = 0; i < length; i++) sum[i] = left[i] + right[i];
      }
      if (width % 2 == 1) {
        std::memmove(level.data() + (width / 2) * length, level.data() + (width - 1) * length,
                     length * sizeof(float));
      }
    }
    // Every part's elements of this chunk have been read: out may be one of the parts.
    std::memcpy(out + begin, level.data(), length * sizeof(float));
  }
}

float tree_sum_scalar(const float* values, int count) {
  TANDEM_CHECK(count >= 1, "tree_sum_scalar: needs at least one value, got ", count);
  std::vector<const float*> parts(count);
  for (int k = 0; k < count; k++) parts[k] = values + k;
  float sum = 0.0f;
  tree_sum(parts.data(), count, 1, &sum);
  return sum;
}

}  // namespace tandem
