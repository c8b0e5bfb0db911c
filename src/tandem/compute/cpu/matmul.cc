// Matmuls through OpenBLAS; weights are stored [OC, C] (out, in) as in torch.nn.Linear.
//
// OpenBLAS's bits depend on how many threads it splits a product over (measured with
// Debian's OpenMP build: every matmul of the demo model differs between 1 and 2 threads),
// which would make training depend on OMP_NUM_THREADS. So tandem splits the rows of each
// product itself, into blocks of a fixed size, and OpenBLAS computes each block on one
// thread (inside an OpenMP parallel region it starts no threads of its own): a block's
// bits depend only on its data and shape, whatever the thread count.
#include <cblas.h>

#include <algorithm>
#include <array>

#include "tandem/compute/cpu/cpu_kernels.h"

namespace tandem::cpu {
namespace {

// Rows of the output per work item: enough that repacking the right-hand operand for
// each block costs little, few enough that small products still spread over the threads.
constexpr int kRowBlock = 128;

// c[M,N] = op(a)[M,K] @ op(b)[K,N] + beta * c, row-major: one product, computed in row
// blocks of kRowBlock, each block one single-threaded cblas_sgemm call.
struct Sgemm {
  CBLAS_TRANSPOSE transa, transb;
  int M, N, K;
  const float* a;
  int lda;
  const float* b;
  int ldb;
  float beta;
  float* c;
  int ldc;

  int blocks() const { return (M + kRowBlock - 1) / kRowBlock; }

  void run_block(int block) const {
    const int first = block * kRowBlock, rows = std::min(kRowBlock, M - first);
    // Row `first` of op(a): a row of a, or a column of a when it is transposed.
    const float* a_rows = transa == CblasNoTrans ? a + static_cast<size_t>(first) * lda : a + first;
    cblas_sgemm(CblasRowMajor, transa, transb, rows, N, K, 1.0f, a_rows, lda, b, ldb, beta,
                c + static_cast<size_t>(first) * ldc, ldc);
  }
};

// The row blocks of independent products (no output shared), as one pool of work items:
// the threads take blocks as they finish, so a product of few rows (a weight gradient of
// 128 output features is a single block) runs beside another's blocks instead of leaving
// a thread waiting. Which thread computes a block does not change its bits.
template <size_t kProducts>
void sgemm_in_row_blocks(const std::array<Sgemm, kProducts>& products) {
  std::array<int, kProducts + 1> first_block{};
  for (size_t p = 0; p < kProducts; p++) first_block[p + 1] = first_block[p] + products[p].blocks();
  const int blocks = first_block[kProducts];
  // Products listed first are started first: list the one of largest blocks first.
#pragma omp parallel for schedule(dynamic, 1)
  for (int item = 0; item < blocks; item++) {
    size_t p = 0;
    while (item >= first_block[p + 1]) p++;
    products[p].run_block(item - first_block[p]);
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  // out[N,OC] = inp[N,C] @ weight[OC,C]^T
  sgemm_in_row_blocks<1>(
      {{{CblasNoTrans, CblasTrans, N, OC, C, inp, C, weight, C, 0.0f, out, OC}}});
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* row = out + static_cast<size_t>(n) * OC;
    for (int o = 0; o < OC; o++) row[o] += bias[o];
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  // dweight[OC,C] += dout[N,OC]^T @ inp[N,C]: its blocks (K = N, the largest) go first.
  // dinp[N,C] = dout[N,OC] @ weight[OC,C]
  sgemm_in_row_blocks<2>(
      {{{CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C},
        {CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, weight, C, 0.0f, dinp, C}}});
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace tandem::cpu
