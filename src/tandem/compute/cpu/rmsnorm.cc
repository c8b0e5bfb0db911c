// RMSNorm forward and backward (Llama): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps),
// over rows of a matrix (the residual stream) or over the heads within rows (Qwen3's q and
// k norms: H rows of HS columns in each row of row_stride). Each row's sums run in column
// order; the weight gradient goes column block by column block with rows in order (a row
// of heads is H rows, head by head), so the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {

// Where the normalised rows lie: row r = (n, h) starts at n * stride + h * C.
struct Rows {
  int N, heads, C, stride;
  size_t count() const { return static_cast<size_t>(N) * heads; }
  size_t at(size_t r) const { return r / heads * stride + r % heads * C; }
};

void forward_rows(ThreadPool& pool, float* out, float* rstd, const float* inp, const float* weight,
                  float eps, Rows rows) {
  const int C = rows.C;
  pool.parallel_for(rows.count(), rows_per_chunk(C), [&](size_t first, size_t last) {
    for (size_t r = first; r < last; r++) {
      const float* x = inp + rows.at(r);
      float* o = out + rows.at(r);
      float sum = 0.0f;
      for (int c = 0; c < C; c++) sum += x[c] * x[c];
      const float s = 1.0f / std::sqrt(sum / C + eps);
      for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
      rstd[r] = s;
    }
  });
}

// dweight += sum over rows of x * rstd * dout; then dinp (+= or =) the input's gradient.
// The weight gradient goes first, so dinp may be dout where it is overwritten.
void backward_rows(ThreadPool& pool, float* dinp, float* dweight, const float* dout,
                   const float* inp, const float* weight, const float* rstd, Rows rows,
                   bool accumulate) {
  const int C = rows.C;
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
  pool.parallel_for(blocks, 1, [&](size_t first, size_t last) {
    for (size_t blk = first; blk < last; blk++) {
      const int c0 = static_cast<int>(blk) * kColumnBlock;
      const int c1 = std::min(C, c0 + kColumnBlock);
      float dw[kColumnBlock] = {};
      for (size_t r = 0; r < rows.count(); r++) {
        const float* x = inp + rows.at(r);
        const float* d = dout + rows.at(r);
        for (int c = c0; c < c1; c++) dw[c - c0] += x[c] * rstd[r] * d[c];
      }
      for (int c = c0; c < c1; c++) dweight[c] += dw[c - c0];
    }
  });
  // With dnorm = dout * weight: dinp = (dnorm - x * rstd^2 * mean(dnorm * x)) * rstd.
  pool.parallel_for(rows.count(), rows_per_chunk(C), [&](size_t first, size_t last) {
    for (size_t r = first; r < last; r++) {
      const float* x = inp + rows.at(r);
      const float* d = dout + rows.at(r);
      float* di = dinp + rows.at(r);
      const float s = rstd[r];
      float dot = 0.0f;
      for (int c = 0; c < C; c++) dot += weight[c] * d[c] * x[c];
      const float m = dot / C * s * s;
      if (accumulate) {
        for (int c = 0; c < C; c++) di[c] += (weight[c] * d[c] - x[c] * m) * s;
      } else {
        for (int c = 0; c < C; c++) di[c] = (weight[c] * d[c] - x[c] * m) * s;
      }
    }
  });
}

}  // namespace

void rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp,
                     const float* weight, float eps, int N, int C) {
  forward_rows(pool, out, rstd, inp, weight, eps, {.N = N, .heads = 1, .C = C, .stride = C});
}

void rmsnorm_backward(ThreadPool& pool, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int N, int C) {
  backward_rows(pool, dinp, dweight, dout, inp, weight, rstd,
                {.N = N, .heads = 1, .C = C, .stride = C}, true);
}

void head_rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp,
                          const float* weight, float eps, int N, int H, int HS, int row_stride) {
  forward_rows(pool, out, rstd, inp, weight, eps,
               {.N = N, .heads = H, .C = HS, .stride = row_stride});
}

void head_rmsnorm_backward(ThreadPool& pool, float* dinp, float* dweight, const float* dout,
                           const float* inp, const float* weight, const float* rstd, int N, int H,
                           int HS, int row_stride) {
  backward_rows(pool, dinp, dweight, dout, inp, weight, rstd,
                {.N = N, .heads = H, .C = HS, .stride = row_stride}, false);
}

}  // namespace tandem::cpu
