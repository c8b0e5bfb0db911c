// Stands in for the CUDA toolkit's cublasLt.h in emulated builds (see ../README.md): the
// subset of cuBLASLt that cublaslt_matmul.cu uses, computed on the host.
//
// Written from NVIDIA's cuBLASLt documentation, not from what cublaslt_matmul.cu expects, so
// that a wrong mapping of row-major tensors onto cuBLASLt's column-major problem fails here:
//  - cublasLtMatmul computes D = alpha * op(A) @ op(B) + beta * C, with op(A) [m, k],
//    op(B) [k, n], C and D [m, n]. Every matrix is column-major: element (i, j) of a
//    layout with leading dimension ld is at i + j * ld. A layout describes the stored
//    matrix, before op: A is [m, k] for CUBLAS_OP_N and [k, m] for CUBLAS_OP_T.
//  - CUBLAS_COMPUTE_32F with CUDA_R_32F scale: products summed in float, alpha and beta are
//    host floats, CUBLASLT_EPILOGUE_BIAS adds bias[i] (of type BIAS_DATA_TYPE, by default
//    D's) to every column's row i, one entry per row of D (m of them), and the result is
//    stored to D's type (CUDA_R_32F or CUDA_R_16BF, rounded to nearest even) once.
//  - A layout whose leading dimension is below its rows, shapes that do not agree with
//    m, n, k and the transposes, or a pointer less aligned than the algorithm was chosen
//    for (the preference's MIN_ALIGNMENT_*_BYTES, default 256; for the bias, the bias
//    pointer's alignment when the heuristic ran) is CUBLAS_STATUS_INVALID_VALUE; a type combination
//    outside the documented table for CUBLAS_COMPUTE_32F is CUBLAS_STATUS_NOT_SUPPORTED.
// Streams are ignored: a call finishes before it returns. `cublaslt_emulation::counters()`
// lets a test see how often the heuristic ran, what the last matmul did, and that every
// object created was destroyed.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

// The toolkit's enumerators, with their values.
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_TRANSC = 5,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = 6,
} cublasLtEpilogue_t;

typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

typedef enum {
  CUBLASLT_REDUCTION_SCHEME_NONE = 0,
  CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
  CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
  CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
  CUBLASLT_REDUCTION_SCHEME_MASK = 7,
} cublasLtReductionScheme_t;

// Opaque objects, as in the toolkit (the layouts of these structs are the stub's own).
struct cublasLtContext {
  int magic;
};
struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type, the documented default
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  // The documented default: 256-byte aligned matrices.
  uint32_t align_a = 256, align_b = 256, align_c = 256, align_d = 256;
};
typedef cublasLtContext* cublasLtHandle_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

namespace cublaslt_emulation {

struct Counters {
  int handles = 0, descs = 0, layouts = 0, preferences = 0;  // alive now
  int heuristic_calls = 0, matmul_calls = 0;
  // The last successful cublasLtMatmul.
  uint32_t last_epilogue = 0;
  float last_beta = 0.0f;
  int last_m = 0, last_n = 0, last_k = 0;
};
inline Counters& counters() {
  static Counters c;
  return c;
}

// The alignments an algorithm was chosen for, kept in the algorithm's opaque data.
constexpr uint64_t kAlgoMagic = 0x5354554243424c54ull;  // "STUBCBLT"

inline bool is_storage_type(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

inline float load(const void* base, cudaDataType_t type, uint64_t index) {
  if (type == CUDA_R_32F) return static_cast<const float*>(base)[index];
  uint16_t h;
  std::memcpy(&h, static_cast<const unsigned char*>(base) + 2 * index, 2);
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void store(void* base, cudaDataType_t type, uint64_t index, float value) {
  if (type == CUDA_R_32F) {
    static_cast<float*>(base)[index] = value;
    return;
  }
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  uint16_t h;
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    h = static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN stays a quiet NaN
  } else {
    h = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // nearest even
  }
  std::memcpy(static_cast<unsigned char*>(base) + 2 * index, &h, 2);
}

// The largest power of two, at most 256, dividing the address (256 for null).
inline uint32_t alignment_of(const void* p) {
  uint32_t bytes = 256;
  while (bytes > 1 && reinterpret_cast<uintptr_t>(p) % bytes != 0) bytes /= 2;
  return bytes;
}

inline bool aligned(const void* p, uint32_t bytes) {
  return bytes == 0 || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Whether the descriptor and layouts make one consistent problem; sets m, n, k.
inline cublasStatus_t check_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                    cublasLtMatrixLayout_t d, uint64_t* m, uint64_t* n,
                                    uint64_t* k) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  // The documented table for CUBLAS_COMPUTE_32F, CUDA_R_32F scale: A, B, C, D all
  // CUDA_R_32F, or A and B CUDA_R_16BF with C = D CUDA_R_16BF or CUDA_R_32F.
  if (desc->compute != CUBLAS_COMPUTE_32F || desc->scale != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->type != b->type || c->type != d->type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a->type == CUDA_R_32F && d->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!is_storage_type(a->type) || !is_storage_type(d->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  for (cublasLtMatrixLayout_t layout : {a, b, c, d})
    if (layout->ld < 1 || static_cast<uint64_t>(layout->ld) < layout->rows)
      return CUBLAS_STATUS_INVALID_VALUE;
  if (desc->transa != CUBLAS_OP_N && desc->transa != CUBLAS_OP_T)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->transb != CUBLAS_OP_N && desc->transb != CUBLAS_OP_T)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *m = d->rows;
  *n = d->cols;
  *k = desc->transa == CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t a_m = desc->transa == CUBLAS_OP_N ? a->rows : a->cols;
  const uint64_t b_k = desc->transb == CUBLAS_OP_N ? b->rows : b->cols;
  const uint64_t b_n = desc->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (a_m != *m || b_k != *k || b_n != *n || c->rows != *m || c->cols != *n)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc->epilogue != CUBLASLT_EPILOGUE_BIAS)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && desc->bias_type != -1) {
    // The bias is of D's type, or fp32 for bf16 D.
    if (desc->bias_type != d->type && desc->bias_type != CUDA_R_32F)
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace cublaslt_emulation

inline const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
inline const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
  }
  return "unknown status";
}

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext{0x4c74};
  cublaslt_emulation::counters().handles++;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  cublaslt_emulation::counters().handles--;
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc,
                                               cublasComputeType_t compute, cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescOpaque_t{compute, scale};
  cublaslt_emulation::counters().descs++;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete desc;
  cublaslt_emulation::counters().descs--;
  return CUBLAS_STATUS_SUCCESS;
}

// Each attribute has the documented type; a buffer of another size is INVALID_VALUE.
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                     cublasLtMatmulDescAttributes_t attribute,
                                                     const void* buf, size_t size) {
  if (desc == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const auto get = [&](auto& field) {
    if (size != sizeof(field)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return get(desc->transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return get(desc->transb);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return get(desc->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return get(desc->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return get(desc->bias_type);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;  // not part of the stub
  }
}

inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // Column-major (the default order): the leading dimension spans at least one column.
  if (ld < 1 || static_cast<uint64_t>(ld) < rows) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
  cublaslt_emulation::counters().layouts++;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete layout;
  cublaslt_emulation::counters().layouts--;
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  if (preference == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *preference = new cublasLtMatmulPreferenceOpaque_t{};
  cublaslt_emulation::counters().preferences++;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  if (preference == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  delete preference;
  cublaslt_emulation::counters().preferences--;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
    const void* buf, size_t size) {
  if (preference == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const auto get = [&](auto& field) {
    if (size != sizeof(field)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return get(preference->max_workspace);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return get(preference->reduction_mask);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return get(preference->align_a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return get(preference->align_b);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return get(preference->align_c);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return get(preference->align_d);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;  // not part of the stub
  }
}

// One algorithm for every valid problem, needing no workspace, that assumes the
// alignments the preference promised (as the heuristic's choices do).
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  cublaslt_emulation::counters().heuristic_calls++;
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (preference == nullptr || requested < 1 || results == nullptr || returned == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  uint64_t m, n, k;
  const cublasStatus_t status = cublaslt_emulation::check_problem(desc, a, b, c, d, &m, &n, &k);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = cublaslt_emulation::kAlgoMagic;
  results[0].algo.data[1] = preference->align_a;
  results[0].algo.data[2] = preference->align_b;
  results[0].algo.data[3] = preference->align_c;
  results[0].algo.data[4] = preference->align_d;
  // The bias pointer is not read here, but its value sets the alignment the algorithm may
  // assume (a null one: any).
  results[0].algo.data[5] =
      desc->epilogue == CUBLASLT_EPILOGUE_BIAS ? cublaslt_emulation::alignment_of(desc->bias) : 0;
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                     const void* alpha, const void* A, cublasLtMatrixLayout_t a,
                                     const void* B, cublasLtMatrixLayout_t b, const void* beta,
                                     const void* C, cublasLtMatrixLayout_t c, void* D,
                                     cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace;
  (void)workspace_bytes;  // the stub's algorithm needs none
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (alpha == nullptr || beta == nullptr || D == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  uint64_t m, n, k;
  const cublasStatus_t status = cublaslt_emulation::check_problem(desc, a, b, c, d, &m, &n, &k);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  if ((k > 0 && (A == nullptr || B == nullptr)) || (beta_value != 0.0f && C == nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  // In place (C == D) needs C's layout to be D's.
  if (C == D && (c->type != d->type || c->ld != d->ld)) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo != nullptr && algo->data[0] == cublaslt_emulation::kAlgoMagic) {
    // The algorithm was chosen for pointers with these alignments.
    using cublaslt_emulation::aligned;
    if (!aligned(A, static_cast<uint32_t>(algo->data[1])) ||
        !aligned(B, static_cast<uint32_t>(algo->data[2])) ||
        !aligned(C, static_cast<uint32_t>(algo->data[3])) ||
        !aligned(D, static_cast<uint32_t>(algo->data[4])) ||
        (desc->epilogue == CUBLASLT_EPILOGUE_BIAS &&
         !aligned(desc->bias, static_cast<uint32_t>(algo->data[5]))))
      return CUBLAS_STATUS_INVALID_VALUE;
  } else if (algo != nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;  // not an algorithm the heuristic returned
  }
  const bool bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (bias && desc->bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const cudaDataType_t bias_type =
      desc->bias_type == -1 ? d->type : static_cast<cudaDataType_t>(desc->bias_type);

  const bool ta = desc->transa == CUBLAS_OP_T, tb = desc->transb == CUBLAS_OP_T;
  const uint64_t lda = a->ld, ldb = b->ld, ldc = c->ld, ldd = d->ld;
  const cudaDataType_t a_type = a->type, b_type = b->type, c_type = c->type, d_type = d->type;
  const void* bias_data = desc->bias;
  // In stream order (../emulated_streams.h); alpha, beta and the descriptors are read now,
  // as the library reads host-side arguments when it is called.
  cuda_emulation::stream_scheduler().submit(stream, [=] {
    using cublaslt_emulation::load;
    // Computed into a separate buffer first: C may be D.
    std::vector<float> result(m * n);
    for (uint64_t j = 0; j < n; j++) {
      for (uint64_t i = 0; i < m; i++) {
        float sum = 0.0f;
        for (uint64_t p = 0; p < k; p++) {
          const float a_ip = load(A, a_type, ta ? p + i * lda : i + p * lda);
          const float b_pj = load(B, b_type, tb ? j + p * ldb : p + j * ldb);
          sum += a_ip * b_pj;
        }
        float value = alpha_value * sum;
        if (beta_value != 0.0f) value += beta_value * load(C, c_type, i + j * ldc);
        if (bias) value += load(bias_data, bias_type, i);
        result[i + j * m] = value;
      }
    }
    for (uint64_t j = 0; j < n; j++)
      for (uint64_t i = 0; i < m; i++)
        cublaslt_emulation::store(D, d_type, i + j * ldd, result[i + j * m]);
  });

  auto& counters = cublaslt_emulation::counters();
  counters.matmul_calls++;
  counters.last_epilogue = desc->epilogue;
  counters.last_beta = beta_value;
  counters.last_m = static_cast<int>(m);
  counters.last_n = static_cast<int>(n);
  counters.last_k = static_cast<int>(k);
  return CUBLAS_STATUS_SUCCESS;
}
