// Matmuls through OpenBLAS; weights are stored [OC, C] (out, in) as in torch.nn.Linear.
//
// OpenBLAS's bits depend on how many threads it splits a product over (measured with
// Debian's OpenMP build: every matmul of the demo model differs between 1 and 2 threads),
// which would make training depend on the thread count. So tandem splits the rows of each
// product itself, into blocks of a fixed size, and OpenBLAS computes each block on the
// thread that took it (told so for the call: see SingleThreadedBlas): a block's bits
// depend only on its data and shape, whatever the thread count.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {

// Rows of the output per work item: enough that repacking the right-hand operand for
// each block costs little, few enough that small products still spread over the threads.
constexpr int kRowBlock = 128;

// OpenBLAS's OpenMP build splits a call over omp_get_max_threads() threads unless it is
// made inside an OpenMP parallel region; the pool's threads are not OpenMP's, so for the
// duration of a block the calling thread's OpenMP thread count (a per-thread setting) is
// one. Without it every block would start a team of its own on the cores the pool uses.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : previous_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreadedBlas() { omp_set_num_threads(previous_); }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_;
};

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
    const SingleThreadedBlas one_thread;
    cblas_sgemm(CblasRowMajor, transa, transb, rows, N, K, 1.0f, a_rows, lda, b, ldb, beta,
                c + static_cast<size_t>(first) * ldc, ldc);
  }
};

// The row blocks of independent products (no output shared), as one pool of work items:
// the threads take blocks as they finish, so a product of few rows (a weight gradient of
// 128 output features is a single block) runs beside another's blocks instead of leaving
// a thread waiting. Which thread computes a block does not change its bits.
template <size_t kProducts>
void sgemm_in_row_blocks(ThreadPool& pool, const std::array<Sgemm, kProducts>& products) {
  std::array<int, kProducts + 1> first_block{};
  for (size_t p = 0; p < kProducts; p++) first_block[p + 1] = first_block[p] + products[p].blocks();
  const int blocks = first_block[kProducts];
  pool.parallel_for(blocks, 1, [&](size_t first, size_t last) {
    for (int item = static_cast<int>(first); item < static_cast<int>(last); item++) {
      size_t p = 0;
      while (item >= first_block[p + 1]) p++;
      products[p].run_block(item - first_block[p]);
    }
  });
}

}  // namespace

void matmul_forward(ThreadPool& pool, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  // out[N,OC] = inp[N,C] @ weight[OC,C]^T
  sgemm_in_row_blocks<1>(
      pool, {{{CblasNoTrans, CblasTrans, N, OC, C, inp, C, weight, C, 0.0f, out, OC}}});
  if (bias == nullptr) return;
  pool.parallel_for(N, rows_per_chunk(OC), [&](size_t first, size_t last) {
    for (size_t n = first; n < last; n++) {
      float* row = out + n * OC;
      for (int o = 0; o < OC; o++) row[o] += bias[o];
    }
  });
}

void matmul_backward(ThreadPool& pool, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  // dweight[OC,C] += dout[N,OC]^T @ inp[N,C]: its blocks (K = N, the largest) go first.
  // dinp[N,C] = dout[N,OC] @ weight[OC,C]
  sgemm_in_row_blocks<2>(
      pool, {{{CblasTrans, CblasNoTrans, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C},
              {CblasNoTrans, CblasNoTrans, N, C, OC, dout, OC, weight, C, 0.0f, dinp, C}}});
  if (dbias != nullptr) column_sums_accumulate(pool, dbias, dout, N, OC);
}

}  // namespace tandem::cpu
