#include "tandem/comm/tree_sum.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/half.h"

namespace tandem {

namespace {

// Elements summed per pass: the partial sums of one pass stay in cache.
constexpr size_t kChunk = 512;

// One pairwise addition: IEEE fp32 for floats; for bf16, in fp32 and rounded once to bf16,
// exactly as the bf16 compute backends add two stored bf16 tensors (residual_forward).
inline float add(float a, float b) { return a + b; }
inline Bf16 add(Bf16 a, Bf16 b) { return from_float<Bf16>(to_float(a) + to_float(b)); }

template <typename T>
void tree_sum_of(const T* const* parts, int count, size_t n, T* out) {
  TANDEM_CHECK(count >= 1, "tree_sum: needs at least one part, got ", count);
  if (count == 1) {
    if (out != parts[0]) std::memmove(out, parts[0], n * sizeof(T));
    return;
  }
  // The values of one level of the tree, for one chunk of elements: value j at j * length.
  const int first_width = (count + 1) / 2;
  std::vector<T> level(static_cast<size_t>(first_width) * std::min(n, kChunk));
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t length = std::min(kChunk, n - begin);
    // The first level, from the parts: neighbours added, an odd last part moved up.
    for (int j = 0; j < count / 2; j++) {
      const T* left = parts[2 * j] + begin;
      const T* right = parts[2 * j + 1] + begin;
      T* sum = level.data() + j * length;
      for (size_t i = 0; i < length; i++) sum[i] = add(left[i], right[i]);
    }
    if (count % 2 == 1) {
      std::memcpy(level.data() + (count / 2) * length, parts[count - 1] + begin,
                  length * sizeof(T));
    }
    // The next levels in place: value j of a level overwrites value j of the one below,
    // which has already been read (j <= 2j).
    for (int width = first_width; width > 1; width = (width + 1) / 2) {
      for (int j = 0; j < width / 2; j++) {
        const T* left = level.data() + 2 * j * length;
        const T* right = left + length;
        T* sum = level.data() + j * length;
        for (size_t i = 0; i < length; i++) sum[i] = add(left[i], right[i]);
      }
      if (width % 2 == 1) {
        std::memmove(level.data() + (width / 2) * length, level.data() + (width - 1) * length,
                     length * sizeof(T));
      }
    }
    // Every part's elements of this chunk have been read: out may be one of the parts.
    std::memcpy(out + begin, level.data(), length * sizeof(T));
  }
}

}  // namespace

void tree_sum(const float* const* parts, int count, size_t n, float* out) {
  tree_sum_of(parts, count, n, out);
}

void tree_sum(const Bf16* const* parts, int count, size_t n, Bf16* out) {
  tree_sum_of(parts, count, n, out);
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
