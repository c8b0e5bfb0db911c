#include "tandem/optim/demo/demo_transform.h"

#include <cmath>
#include <memory>
#include <numbers>

#include "tandem/core/error.h"
#include "tandem/optim/demo/demo_simd.h"

namespace tandem {

int64_t demo_chunk(int64_t n, int64_t chunk) {
  TANDEM_CHECK(n >= 1 && chunk >= 1, "demo_chunk: dimension ", n, " and chunk ", chunk,
               " must be at least 1");
  if (n <= chunk) return n;
  for (int64_t c = chunk; c > 1; c--)
    if (n % c == 0) return c;
  return 1;
}

std::vector<float> dct_matrix(int64_t n) {
  std::vector<float> c(static_cast<size_t>(n * n));
  for (int64_t k = 0; k < n; k++) {
    const double s = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    for (int64_t j = 0; j < n; j++) {
      c[k * n + j] =
          static_cast<float>(s * std::cos(std::numbers::pi * static_cast<double>((2 * j + 1) * k) /
                                          (2.0 * static_cast<double>(n))));
    }
  }
  return c;
}

DemoBlocks::DemoBlocks(const std::vector<int64_t>& shape, int64_t chunk, const char* name,
                       SimdTarget target)
    : target_(target) {
  TANDEM_CHECK(chunk >= 1, "optimizer.params.compression_chunk = ", chunk,
               " must be at least 1 (the reference uses 64)");
  TANDEM_CHECK(shape.size() == 1 || shape.size() == 2, "DeMo: ", name, " has ", shape.size(),
               " dimensions; DeMo compresses 1-D and 2-D tensors only (reshape it, or train "
               "with AdamW)");
  TANDEM_CHECK(cpu_supports(target), "DeMo: this CPU has no ", simd_target_name(target));
  for (int64_t d : shape) TANDEM_CHECK(d >= 1, "DeMo: ", name, " has an empty dimension (", d, ")");
  if (shape.size() == 2) {
    rows_ = shape[0];
    cols_ = shape[1];
    cm_ = demo_chunk(rows_, chunk);
  } else {
    cols_ = shape[0];
  }
  cn_ = demo_chunk(cols_, chunk);
  c_m_ = dct_matrix(cm_);
  c_n_ = dct_matrix(cn_);
  c_n_t_.resize(c_n_.size());
  for (int64_t l = 0; l < cn_; l++)
    for (int64_t b = 0; b < cn_; b++) c_n_t_[b * cn_ + l] = c_n_[l * cn_ + b];
}

int64_t DemoBlocks::block_origin(int64_t block) const {
  const int64_t grid_cols = cols_ / cn_;
  return (block / grid_cols) * cm_ * cols_ + (block % grid_cols) * cn_;
}

void DemoBlocks::forward(const float* x, int64_t block, float* z) const {
  const float* origin = x + block_origin(block);
  const auto cm = static_cast<size_t>(cm_), cn = static_cast<size_t>(cn_);
  const std::unique_ptr<float[]> y(new float[cm * cn]);  // every element written below
  // Along rows: Y[a][l] = sum_b X[a][b] C_n[l][b] = sum_b X[a][b] C_n^T[b][l].
  combine_rows(
      target_, y.get(), origin, c_n_t_.data(),
      {.out_stride = cn, .coeff_row = static_cast<size_t>(cols_), .coeff_col = 1, .row_stride = cn},
      cm, cn, cn, CombineSkip::kNone);
  // Along columns: Z[k][l] = sum_a C_m[k][a] Y[a][l].
  combine_rows(target_, z, c_m_.data(), y.get(),
               {.out_stride = cn, .coeff_row = cm, .coeff_col = 1, .row_stride = cn}, cm, cm, cn,
               CombineSkip::kNone);
}

void DemoBlocks::inverse_block(const float* z, float* x) const {
  const auto bs = static_cast<size_t>(cm_ * cn_);
  const std::unique_ptr<int32_t[]> indices(new int32_t[bs]);
  const std::unique_ptr<float[]> values(new float[bs]);
  size_t count = 0;
  for (size_t i = 0; i < bs; i++) {  // branch-free: the nonzeros are few and anywhere
    indices[count] = static_cast<int32_t>(i);
    values[count] = z[i];
    count += z[i] != 0.0f;
  }
  inverse_sparse(indices.get(), values.get(), count, x);
}

void DemoBlocks::inverse_sparse(const int32_t* indices, const float* values, size_t count,
                                float* x) const {
  const auto cm = static_cast<size_t>(cm_), cn = static_cast<size_t>(cn_);
  // Only the rows of Z with a nonzero coefficient take part (at most topk of cm for the
  // kept coefficients): a row of zeros gives a row of +0 in Y, whose terms the second stage
  // skips. Per live row: its nonzeros (ls, zs), its row of Y, and its row of C_m (cr).
  const std::unique_ptr<float[]> scratch(new float[cm * cn + cn + cm * cm]);
  float* y = scratch.get();
  float* zs = y + cm * cn;
  float* cr = zs + cn;
  const std::unique_ptr<int32_t[]> ls(new int32_t[cn]);
  size_t live = 0;
  bool y_has_zeros = false;
  for (size_t t = 0; t < count;) {
    const size_t k = static_cast<size_t>(indices[t]) / cn;
    size_t nonzeros = 0;
    for (; t < count && static_cast<size_t>(indices[t]) / cn == k; t++) {
      if (values[t] == 0.0f) continue;  // as a dense Z's zeros: skipped
      zs[nonzeros] = values[t];
      ls[nonzeros++] = static_cast<int32_t>(static_cast<size_t>(indices[t]) % cn);
    }
    if (nonzeros == 0) continue;
    // Y[k][b] = sum_l Z[k][l] C_n[l][b] over the nonzero Z[k][l].
    float* yk = y + live * cn;
    combine_sparse_row(target_, yk, zs, ls.get(), nonzeros, c_n_.data(), cn, cn);
    for (size_t b = 0; b < cn; b++) y_has_zeros |= yk[b] == 0.0f;
    std::copy(c_m_.data() + k * cm, c_m_.data() + (k + 1) * cm, cr + live * cm);
    live++;
  }
  // X[a][b] = sum_k C_m[k][a] Y[k][b] over the live k, skipping the zero Y[k][b] (with none,
  // nothing is skipped, and the unmasked kernel gives the same bits): the coefficients are
  // the live rows of C_m, transposed.
  combine_rows(target_, x, cr, y,
               {.out_stride = cn, .coeff_row = 1, .coeff_col = cm, .row_stride = cn}, cm, live, cn,
               y_has_zeros ? CombineSkip::kZeroRowElements : CombineSkip::kNone);
}

void DemoBlocks::inverse(const float* z, int64_t block, float* out) const {
  const std::unique_ptr<float[]> x(new float[cm_ * cn_]);
  inverse_block(z, x.get());
  float* origin = out + block_origin(block);
  for (int64_t a = 0; a < cm_; a++)
    for (int64_t b = 0; b < cn_; b++) origin[a * cols_ + b] = x[a * cn_ + b];
}

}  // namespace tandem
