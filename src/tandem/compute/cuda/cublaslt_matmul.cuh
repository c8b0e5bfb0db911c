// The GPT matmuls through cuBLASLt, for tensors stored as float or Bf16.
//
// fp32 storage: CUDA_R_32F matrices with CUBLAS_COMPUTE_32F, true fp32 (no TF32), so the
// results stay close to the CPU backend's. Bf16 storage: CUDA_R_16BF matrices with
// CUBLAS_COMPUTE_32F and fp32 scale factors: products are accumulated in fp32, the result
// is rounded to bf16 once. Split-K partial sums are kept in fp32 too (no reduction in
// the output type), which also keeps every matmul deterministic.
//
// Row-major tensors meet column-major cuBLAS by reading a row-major [R, K] array as a
// column-major [K, R] one; each call below says which product that makes.
//
// Descriptors and the heuristic's algorithm are cached per problem (shape, transposes,
// dtype, bias epilogue and pointer alignments), so that after the first step of training
// no call searches for an algorithm again.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "tandem/core/half.h"

namespace tandem::cuda {

class CublasLtMatmul {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  // Creates the handle and the workspace on the current device; every matmul is queued on
  // `stream`.
  explicit CublasLtMatmul(cudaStream_t stream, size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLtMatmul();
  CublasLtMatmul(const CublasLtMatmul&) = delete;
  CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;

  // out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be null).
  template <typename Elem>
  void forward(Elem* out, const Elem* inp, const Elem* weight, const Elem* bias, int N, int C,
               int OC);
  // dinp[N,C] = dout[N,OC] @ weight[OC,C] (overwritten).
  template <typename Elem>
  void backward_input(Elem* dinp, const Elem* dout, const Elem* weight, int N, int C, int OC);
  // dweight[OC,C] += dout[N,OC]^T @ inp[N,C] (beta = 1: added before the one rounding).
  template <typename Elem>
  void backward_weight(Elem* dweight, const Elem* dout, const Elem* inp, int N, int C, int OC);

 private:
  // One column-major problem D[m,n] = op(A)[m,k] @ op(B)[k,n] (+ beta C, C = D), and
  // what the heuristic's choice depends on.
  struct Problem {
    cudaDataType_t type;
    cublasOperation_t transa, transb;
    int m, n, k, lda, ldb, ldd;
    bool bias;  // CUBLASLT_EPILOGUE_BIAS: D += bias[m] broadcast over the n columns
    // Largest power of two (at most 256) dividing each pointer's address.
    uint32_t align_a, align_b, align_d, align_bias;

    auto tie() const {
      return std::tie(type, transa, transb, m, n, k, lda, ldb, ldd, bias, align_a, align_b, align_d,
                      align_bias);
    }
    bool operator<(const Problem& other) const { return tie() < other.tie(); }
  };

  // The cuBLASLt objects for one Problem: built and searched once, then reused.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // false: the heuristic has no algorithm for this problem
    ~Plan();
  };

  // The cached plan for `problem`, created on first use. `bias` is the bias pointer the
  // heuristic is asked about (its alignment matters).
  Plan& plan(const Problem& problem, const void* bias, const char* what);
  // D = A B (+ beta D) (+ bias) on the stream; fails, naming `what`, when no algorithm
  // exists or cuBLASLt reports an error.
  void run(const Problem& problem, const void* a, const void* b, void* d, const void* bias,
           float beta, const char* what);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_;
  std::map<Problem, std::unique_ptr<Plan>> plans_;
};

}  // namespace tandem::cuda
