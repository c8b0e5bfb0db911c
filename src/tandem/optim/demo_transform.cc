#include "tandem/optim/demo_transform.h"

#include <cmath>
#include <numbers>

#include "tandem/core/error.h"

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

DemoBlocks::DemoBlocks(const std::vector<int64_t>& shape, int64_t chunk, const char* name) {
  TANDEM_CHECK(chunk >= 1, "optimizer.params.compression_chunk = ", chunk,
               " must be at least 1 (the reference uses 64)");
  TANDEM_CHECK(shape.size() == 1 || shape.size() == 2, "DeMo: ", name, " has ", shape.size(),
               " dimensions; DeMo compresses 1-D and 2-D tensors only (reshape it, or train "
               "with AdamW)");
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
}

void DemoBlocks::forward(const float* x, int64_t block, float* z) const {
  const int64_t grid_cols = cols_ / cn_;
  const int64_t row0 = (block / grid_cols) * cm_, col0 = (block % grid_cols) * cn_;
  std::vector<float> y(static_cast<size_t>(cm_ * cn_));
  // Along rows: Y[a][l] = sum_b X[a][b] C_n[l][b].
  for (int64_t a = 0; a < cm_; a++) {
    const float* xa = x + (row0 + a) * cols_ + col0;
    for (int64_t l = 0; l < cn_; l++) {
      const float* cl = c_n_.data() + l * cn_;
      float acc = 0.0f;
      for (int64_t b = 0; b < cn_; b++) acc = std::fma(xa[b], cl[b], acc);
      y[a * cn_ + l] = acc;
    }
  }
  // Along columns: Z[k][l] = sum_a C_m[k][a] Y[a][l].
  for (int64_t k = 0; k < cm_; k++) {
    const float* ck = c_m_.data() + k * cm_;
    for (int64_t l = 0; l < cn_; l++) {
      float acc = 0.0f;
      for (int64_t a = 0; a < cm_; a++) acc = std::fma(ck[a], y[a * cn_ + l], acc);
      z[k * cn_ + l] = acc;
    }
  }
}

void DemoBlocks::inverse_block(const float* z, float* x) const {
  std::vector<float> y(static_cast<size_t>(cm_ * cn_));
  // Y[k][b] = sum_l Z[k][l] C_n[l][b] (zeros skipped: they add nothing).
  for (int64_t k = 0; k < cm_; k++) {
    float* yk = y.data() + k * cn_;
    for (int64_t b = 0; b < cn_; b++) yk[b] = 0.0f;
    for (int64_t l = 0; l < cn_; l++) {
      const float zkl = z[k * cn_ + l];
      if (zkl == 0.0f) continue;
      const float* cl = c_n_.data() + l * cn_;
      for (int64_t b = 0; b < cn_; b++) yk[b] = std::fma(zkl, cl[b], yk[b]);
    }
  }
  // X[a][b] = sum_k C_m[k][a] Y[k][b].
  for (int64_t a = 0; a < cm_; a++)
    for (int64_t b = 0; b < cn_; b++) x[a * cn_ + b] = 0.0f;
  for (int64_t k = 0; k < cm_; k++) {
    const float* yk = y.data() + k * cn_;
    for (int64_t a = 0; a < cm_; a++) {
      const float cka = c_m_[k * cm_ + a];
      float* xa = x + a * cn_;
      for (int64_t b = 0; b < cn_; b++) xa[b] = std::fma(cka, yk[b], xa[b]);
    }
  }
}

void DemoBlocks::inverse_add(const float* z, int64_t block, float sign, float* out) const {
  std::vector<float> x(static_cast<size_t>(cm_ * cn_));
  inverse_block(z, x.data());
  const int64_t grid_cols = cols_ / cn_;
  const int64_t row0 = (block / grid_cols) * cm_, col0 = (block % grid_cols) * cn_;
  for (int64_t a = 0; a < cm_; a++) {
    float* oa = out + (row0 + a) * cols_ + col0;
    for (int64_t b = 0; b < cn_; b++) oa[b] = oa[b] + sign * x[a * cn_ + b];
  }
}

void DemoBlocks::inverse(const float* z, int64_t block, float* out) const {
  std::vector<float> x(static_cast<size_t>(cm_ * cn_));
  inverse_block(z, x.data());
  const int64_t grid_cols = cols_ / cn_;
  const int64_t row0 = (block / grid_cols) * cm_, col0 = (block % grid_cols) * cn_;
  for (int64_t a = 0; a < cm_; a++) {
    float* oa = out + (row0 + a) * cols_ + col0;
    for (int64_t b = 0; b < cn_; b++) oa[b] = x[a * cn_ + b];
  }
}

}  // namespace tandem
