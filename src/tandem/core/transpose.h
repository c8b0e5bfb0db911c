// Transposes of fp32 matrices, as the checkpoint files need them (a GPT-2 Conv1D weight is
// [out, in] in tandem and [in, out] in Hugging Face's files). A pure permutation: no bits
// change, on any path.
#pragma once

#include <cstdint>

namespace tandem {

// Rows [c0, c1) of the transpose of in [rows, cols] into out ((c1 - c0) x rows): out[c - c0]
// [r] = in[r][c]. In tiles that stay in the cache on both sides, 8 x 8 blocks at a time in
// AVX registers where the CPU has AVX2.
void transpose_rows(const float* in, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                    float* out);

// out [cols, rows] = the transpose of in [rows, cols].
inline void transpose(const float* in, float* out, int64_t rows, int64_t cols) {
  transpose_rows(in, rows, cols, 0, cols, out);
}

}  // namespace tandem
