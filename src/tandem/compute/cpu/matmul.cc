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

#include "tandem/compute/cpu/cpu_kernels.h"

namespace tandem::cpu {
namespace {

// Rows of the output per work item: enough that repacking the right-hand operand for
// each block costs little, few enough that small products still spread over the threads.
constexpr int kRowBlock = 128;

// c[M,N] = op(a)[M,K] @ op(b)[K,N] + beta * c, row-major, in row blocks of kRowBlock.
void sgemm_in_row_blocks(CBLAS_TRANSPOSE transa, CBLAS_TRANSPOSE transb, int M, int N, int K,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc) {
  const int blocks = (M + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static)
  for (int block = 0; block < blocks; block++) {
    const int first = block * kRowBlock, rows = std::min(kRowBlock, M - first);
    // Row `first` of op(a): a row of a, or a column of a when it is transposed.
    const float* a_rows = transa == CblasNoTrans ? a + static_cast<size_t>(first) * lda : a + first;
    cblas_sgemm(CblasRowMajor, transa, transb, rows, N, K, 1.0f, a_rows, lda, b, ldb, beta,
                c + static_cast<size_t>(first) * ldc, ldc);
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  // out[N,OC] = inp[N,C] @ weight[OC,C]^T
  sgemm_in_row_blocks(CblasNoTrans, CblasTrans, N, OC, C, inp, C, weight, C, 0.0f, out, OC);
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* row = out + static_cast<size_t>(n) * OC;
    for (int o = 0; o < OC; o++) row[o] += bias[o];
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  // dinp[N,C] = dout[N,OC] @ weight[OC,C]
  sgemm_in_row_blocks(CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, weight, C, 0.0f, dinp, C);
  // dweight[OC,C] += dout[N,OC]^T @ inp[N,C]
  sgemm_in_row_blocks(CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace tandem::cpu
