#include <type_traits>

#include "tandem/compute/cuda/cublaslt_matmul.cuh"
#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_check.h"

namespace tandem::cuda {
namespace {

void check(cublasStatus_t status, const char* call, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt ", call, " failed in ", what, ": ", cublasLtGetStatusName(status), " (",
         cublasLtGetStatusString(status), ")");
}

template <typename Elem>
constexpr cudaDataType_t data_type() {
  static_assert(std::is_same_v<Elem, float> || std::is_same_v<Elem, Bf16>);
  if constexpr (std::is_same_v<Elem, Bf16>) {
    return CUDA_R_16BF;
  } else {
    return CUDA_R_32F;
  }
}

const char* type_name(cudaDataType_t type) { return type == CUDA_R_16BF ? "bf16" : "fp32"; }

// The largest power of two, at most 256, that divides the address. cuBLASLt assumes
// 256-byte aligned matrices unless told otherwise, and our tensors are often views at
// arbitrary offsets into one parameter or activation buffer.
uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value,
              const char* name, const char* what) {
  check(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), name, what);
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t preference,
                    cublasLtMatmulPreferenceAttributes_t attribute, const T& value,
                    const char* name, const char* what) {
  check(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)), name,
        what);
}

}  // namespace

CublasLtMatmul::Plan::~Plan() {
  if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
  if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
  if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
  if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
}

CublasLtMatmul::CublasLtMatmul(cudaStream_t stream, size_t workspace_bytes)
    : stream_(stream), workspace_bytes_(workspace_bytes) {
  const char* what = "cuBLASLt setup";
  try {
    check(cublasLtCreate(&handle_), "cublasLtCreate", what);
    check(cublasLtMatmulPreferenceCreate(&preference_), "cublasLtMatmulPreferenceCreate", what);
    const uint64_t max_workspace = workspace_bytes_;
    set_preference(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace,
                   "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", what);
    // Split-K partial sums only in the compute type (fp32), reduced in a separate step:
    // no partial sums rounded to bf16 (the output type), none added in place in whatever
    // order blocks finish.
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    set_preference(preference_, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction,
                   "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)", what);
    cuda_check(cudaMalloc(&workspace_, workspace_bytes_), "cudaMalloc (cuBLASLt workspace)");
  } catch (...) {
    if (preference_ != nullptr) cublasLtMatmulPreferenceDestroy(preference_);
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    throw;
  }
}

CublasLtMatmul::~CublasLtMatmul() {
  plans_.clear();
  // cudaFree waits for queued work that may still use the workspace.
  cudaFree(workspace_);
  cublasLtMatmulPreferenceDestroy(preference_);
  cublasLtDestroy(handle_);
}

CublasLtMatmul::Plan& CublasLtMatmul::plan(const Problem& p, const void* bias, const char* what) {
  const auto cached = plans_.find(p);
  if (cached != plans_.end()) return *cached->second;

  auto plan = std::make_unique<Plan>();
  // fp32 products and sums whatever the storage; alpha and beta are fp32 host values.
  check(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate", what);
  const int32_t transa = p.transa, transb = p.transb;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, transa,
           "cublasLtMatmulDescSetAttribute(TRANSA)", what);
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, transb,
           "cublasLtMatmulDescSetAttribute(TRANSB)", what);
  const uint32_t epilogue = p.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue,
           "cublasLtMatmulDescSetAttribute(EPILOGUE)", what);
  if (p.bias) {
    // The bias is stored like D; the heuristic reads the pointer's alignment.
    const int32_t bias_type = p.type;
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type,
             "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)", what);
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias,
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", what);
  }

  // Stored (before op) shapes: op(A) is [m, k], op(B) is [k, n], D is [m, n].
  const bool a_plain = p.transa == CUBLAS_OP_N, b_plain = p.transb == CUBLAS_OP_N;
  check(
      cublasLtMatrixLayoutCreate(&plan->a, p.type, a_plain ? p.m : p.k, a_plain ? p.k : p.m, p.lda),
      "cublasLtMatrixLayoutCreate(A)", what);
  check(
      cublasLtMatrixLayoutCreate(&plan->b, p.type, b_plain ? p.k : p.n, b_plain ? p.n : p.k, p.ldb),
      "cublasLtMatrixLayoutCreate(B)", what);
  check(cublasLtMatrixLayoutCreate(&plan->d, p.type, p.m, p.n, p.ldd),
        "cublasLtMatrixLayoutCreate(D)", what);

  // C is D (same pointer and layout), so it has D's alignment.
  set_preference(preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_a,
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)", what);
  set_preference(preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_b,
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)", what);
  set_preference(preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_d,
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)", what);
  set_preference(preference_, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_d,
                 "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)", what);

  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan->desc, plan->a, plan->b, plan->d, plan->d, preference_, 1, &result, &count);
  if (status == CUBLAS_STATUS_SUCCESS) {
    plan->found = count > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    plan->algo = result.algo;
  } else if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
    check(status, "cublasLtMatmulAlgoGetHeuristic", what);
  }
  return *plans_.emplace(p, std::move(plan)).first->second;
}

void CublasLtMatmul::run(const Problem& p, const void* a, const void* b, void* d, const void* bias,
                         float beta, const char* what) {
  Plan& plan = this->plan(p, bias, what);
  if (!plan.found)
    fail("cuBLASLt has no ", type_name(p.type), " algorithm for ", what, " (m ", p.m, ", n ", p.n,
         ", k ", p.k, ", alignments ", p.align_a, "/", p.align_b, "/", p.align_d, " bytes",
         p.bias ? ", bias epilogue" : "", ")");
  if (p.bias)
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias,
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", what);
  const float alpha = 1.0f;
  check(cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, d, plan.d, d,
                       plan.d, &plan.algo, workspace_, workspace_bytes_, stream_),
        "cublasLtMatmul", what);
}

template <typename Elem>
void CublasLtMatmul::forward(Elem* out, const Elem* inp, const Elem* weight, const Elem* bias,
                             int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  // Column-major: out'[OC,N] = (weight'[C,OC])^T @ inp'[C,N].
  Problem p{data_type<Elem>(),    CUBLAS_OP_T,       CUBLAS_OP_N,       OC, N, C, C, C, OC, false,
            alignment_of(weight), alignment_of(inp), alignment_of(out), 0};
  if (bias == nullptr) {
    run(p, weight, inp, out, nullptr, 0.0f, "matmul_forward");
    return;
  }
  // The bias epilogue adds bias[OC] (one per row of the column-major D) before D is
  // rounded. It is used only for a 16-byte aligned bias, which some GPUs' epilogues need.
  Problem with_bias = p;
  with_bias.bias = true;
  with_bias.align_bias = alignment_of(bias);
  if (with_bias.align_bias >= 16 && plan(with_bias, bias, "matmul_forward (bias)").found) {
    run(with_bias, weight, inp, out, bias, 0.0f, "matmul_forward (bias)");
    return;
  }
  // Otherwise out starts as the bias rows and the GEMM adds the product with beta = 1:
  // still one rounding of (product + bias).
  broadcast_rows(out, bias, N, OC, stream_);
  run(p, weight, inp, out, nullptr, 1.0f, "matmul_forward (bias rows)");
}

template <typename Elem>
void CublasLtMatmul::backward_input(Elem* dinp, const Elem* dout, const Elem* weight, int N, int C,
                                    int OC) {
  if (N == 0 || C == 0) return;
  // Column-major: dinp'[C,N] = weight'[C,OC] @ dout'[OC,N].
  const Problem p{
      data_type<Elem>(),    CUBLAS_OP_N,        CUBLAS_OP_N,        C, N, OC, C, OC, C, false,
      alignment_of(weight), alignment_of(dout), alignment_of(dinp), 0};
  run(p, weight, dout, dinp, nullptr, 0.0f, "matmul_backward (dinp)");
}

template <typename Elem>
void CublasLtMatmul::backward_weight(Elem* dweight, const Elem* dout, const Elem* inp, int N, int C,
                                     int OC) {
  if (N == 0 || C == 0 || OC == 0) return;
  // Column-major: dweight'[C,OC] += inp'[C,N] @ (dout'[OC,N])^T.
  const Problem p{
      data_type<Elem>(), CUBLAS_OP_N,        CUBLAS_OP_T,           C, OC, N, C, OC, C, false,
      alignment_of(inp), alignment_of(dout), alignment_of(dweight), 0};
  run(p, inp, dout, dweight, nullptr, 1.0f, "matmul_backward (dweight)");
}

template void CublasLtMatmul::forward<float>(float*, const float*, const float*, const float*, int,
                                             int, int);
template void CublasLtMatmul::forward<Bf16>(Bf16*, const Bf16*, const Bf16*, const Bf16*, int, int,
                                            int);
template void CublasLtMatmul::backward_input<float>(float*, const float*, const float*, int, int,
                                                    int);
template void CublasLtMatmul::backward_input<Bf16>(Bf16*, const Bf16*, const Bf16*, int, int, int);
template void CublasLtMatmul::backward_weight<float>(float*, const float*, const float*, int, int,
                                                     int);
template void CublasLtMatmul::backward_weight<Bf16>(Bf16*, const Bf16*, const Bf16*, int, int, int);

}  // namespace tandem::cuda
