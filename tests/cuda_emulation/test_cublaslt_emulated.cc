// The cuBLASLt matmuls of cublaslt_matmul.cu (tandem::cuda::CublasLtMatmul) run on the CPU
// (see cuda_emulation/README.md): the real source, compiled by the host compiler against
// cuda_emulation/stub/cublasLt.h, which computes what NVIDIA documents cublasLtMatmul to
// compute (column-major D = alpha op(A) op(B) + beta C, bias per row of D, fp32 sums, one
// rounding to D's type) and rejects inconsistent layouts. A row-major tensor mapped onto the
// wrong column-major problem therefore gives wrong numbers or a cuBLASLt error here, as it
// would on a GPU. The references are the CPU backend's matmuls (tandem::cpu's, overloaded for
// fp32 and Bf16), with the tolerances of test_cuda_backend.cc.
//
// "Device memory" is host memory. Outputs start as NaN, and every tensor sits between guard
// elements that must survive, so an element not written, or written through a wrong
// leading dimension, fails.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/compute/cpu/bf16_kernels.h"
#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/compute/cuda/cublaslt_matmul.cuh"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"

namespace tandem {
namespace {

// The CPU reference kernels' threads, shared by the tests of this file.
ThreadPool& kernel_pool() {
  static ThreadPool pool(2, false);
  return pool;
}

using testing::nans;
using testing::randn;
using testing::stored;

constexpr int kGuard = 64;           // guard elements on each side of a tensor
constexpr float kGuardValue = 3072;  // exact in bf16

// n elements at `offset` elements past a 256-byte boundary (so offset 0 is as aligned as
// cudaMalloc's memory, offset 1 is 4- or 2-byte aligned), between guard elements.
template <typename Elem>
class Tensor {
 public:
  Tensor(const std::vector<Elem>& values, int offset)
      : n_(values.size()),
        offset_(offset),
        total_(base() + offset + n_ + kGuard),
        p_(static_cast<Elem*>(::operator new(total_ * sizeof(Elem), kAlign))) {
    std::fill(p_.get(), p_.get() + total_, from_float<Elem>(kGuardValue));
    std::copy(values.begin(), values.end(), data());
  }
  Elem* data() { return p_.get() + base() + offset_; }
  std::vector<Elem> values() const {
    return std::vector<Elem>(p_.get() + base() + offset_, p_.get() + base() + offset_ + n_);
  }
  bool guards_intact() const {
    for (size_t i = 0; i < total_; i++) {
      if (i >= base() + offset_ && i < base() + offset_ + n_) continue;
      if (to_float(p_.get()[i]) != kGuardValue) return false;
    }
    return true;
  }

 private:
  static constexpr std::align_val_t kAlign{256};
  // The guard in front: at least kGuard elements, a whole number of 256-byte blocks.
  static constexpr size_t base() {
    return (kGuard * sizeof(Elem) + 255) / 256 * 256 / sizeof(Elem);
  }
  struct Free {
    void operator()(Elem* p) const { ::operator delete(p, kAlign); }
  };
  size_t n_;
  int offset_;
  size_t total_;
  std::unique_ptr<Elem, Free> p_;
};

// Every element within rel * max|expected| (+ 1e-6), as Twin::expect_near in
// test_cuda_backend.cc.
template <typename Elem>
void expect_near(const std::vector<Elem>& expected, const std::vector<Elem>& actual, double rel,
                 const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  double scale = 0;
  for (const Elem& e : expected) scale = std::max(scale, std::fabs(double{to_float(e)}));
  for (size_t i = 0; i < expected.size(); i++)
    ASSERT_NEAR(to_float(expected[i]), to_float(actual[i]), rel * scale + 1e-6)
        << what << "[" << i << "]";
}

template <typename Elem>
bool same_bits(const std::vector<Elem>& a, const std::vector<Elem>& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](const Elem& x, const Elem& y) {
           return bit_copy<uint32_t>(to_float(x)) == bit_copy<uint32_t>(to_float(y));
         });
}

struct Shape {
  int N, C, OC;
  int offset;       // elements past a 256-byte boundary of inp, weight, dout and the outputs
  int bias_offset;  // elements past a 256-byte boundary of the bias
};

std::string describe(const Shape& s, bool bf16) {
  return "N " + std::to_string(s.N) + " C " + std::to_string(s.C) + " OC " + std::to_string(s.OC) +
         " offset " + std::to_string(s.offset) + " bias offset " + std::to_string(s.bias_offset) +
         (bf16 ? " bf16" : " fp32");
}

// forward (with and without bias), backward_input and backward_weight (onto non-zero
// dweight) against the CPU, and what each call asked cuBLASLt for.
template <typename Elem>
void expect_matmuls_match(const Shape& s, double rel) {
  constexpr bool kBf16 = sizeof(Elem) == 2;
  SCOPED_TRACE(describe(s, kBf16));
  const int N = s.N, C = s.C, OC = s.OC;
  const size_t NC = static_cast<size_t>(N) * C, NOC = static_cast<size_t>(N) * OC,
               OCC = static_cast<size_t>(OC) * C;
  const auto inp_v = stored<Elem>(randn(NC, 1)), w_v = stored<Elem>(randn(OCC, 2, 0.5f));
  const auto b_v = stored<Elem>(randn(OC, 3, 0.5f)), dout_v = stored<Elem>(randn(NOC, 4));
  const auto dw_v = stored<Elem>(randn(OCC, 5, 0.1f));
  Tensor<Elem> inp(inp_v, s.offset), weight(w_v, s.offset), bias(b_v, s.bias_offset),
      dout(dout_v, s.offset);
  auto& counters = cublaslt_emulation::counters();
  const auto expect_call = [&](uint32_t epilogue, float beta, int m, int n, int k,
                               const char* what) {
    EXPECT_EQ(counters.last_epilogue, epilogue) << what;
    EXPECT_EQ(counters.last_beta, beta) << what;
    EXPECT_EQ(counters.last_m, m) << what;
    EXPECT_EQ(counters.last_n, n) << what;
    EXPECT_EQ(counters.last_k, k) << what;
  };
  {
    cuda::CublasLtMatmul matmul(nullptr);

    // forward without bias.
    std::vector<Elem> expected(NOC);
    cpu::matmul_forward(kernel_pool(), expected.data(), inp_v.data(), w_v.data(), nullptr, N, C,
                        OC);
    Tensor<Elem> out(nans<Elem>(NOC), s.offset);
    int calls = counters.matmul_calls;
    matmul.forward(out.data(), inp.data(), weight.data(), static_cast<const Elem*>(nullptr), N, C,
                   OC);
    EXPECT_EQ(counters.matmul_calls, calls + 1);
    expect_call(CUBLASLT_EPILOGUE_DEFAULT, 0.0f, OC, N, C, "forward without bias");
    expect_near(expected, out.values(), rel, "matmul_forward without bias");
    EXPECT_TRUE(out.guards_intact()) << "matmul_forward without bias";

    // The second identical call reuses the plan: no heuristic search, the same bits.
    const std::vector<Elem> first = out.values();
    const int searches = counters.heuristic_calls;
    matmul.forward(out.data(), inp.data(), weight.data(), static_cast<const Elem*>(nullptr), N, C,
                   OC);
    EXPECT_EQ(counters.heuristic_calls, searches) << "the plan cache was not hit";
    EXPECT_TRUE(same_bits(first, out.values())) << "a repeated forward changed the result";

    // forward with bias: the epilogue for a 16-byte aligned bias, otherwise the bias rows
    // (broadcast_rows) and beta = 1.
    cpu::matmul_forward(kernel_pool(), expected.data(), inp_v.data(), w_v.data(), b_v.data(), N, C,
                        OC);
    Tensor<Elem> out_b(nans<Elem>(NOC), s.offset);
    calls = counters.matmul_calls;
    matmul.forward(out_b.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    EXPECT_EQ(counters.matmul_calls, calls + 1);
    const bool epilogue = (s.bias_offset * sizeof(Elem)) % 16 == 0;
    if (epilogue) {
      expect_call(CUBLASLT_EPILOGUE_BIAS, 0.0f, OC, N, C, "forward with an aligned bias");
    } else {
      expect_call(CUBLASLT_EPILOGUE_DEFAULT, 1.0f, OC, N, C, "forward with a misaligned bias");
    }
    expect_near(expected, out_b.values(), rel, "matmul_forward");
    EXPECT_TRUE(out_b.guards_intact()) << "matmul_forward";
    EXPECT_TRUE(bias.guards_intact()) << "matmul_forward bias";
    // Again: the cached plan, the same bits (the bias pointer is set again on every call).
    const std::vector<Elem> first_b = out_b.values();
    const int searches_b = counters.heuristic_calls;
    matmul.forward(out_b.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    EXPECT_EQ(counters.heuristic_calls, searches_b) << "the plan cache was not hit (bias)";
    EXPECT_TRUE(same_bits(first_b, out_b.values())) << "a repeated forward changed the result";

    // backward_input overwrites dinp; backward_weight adds onto dweight.
    std::vector<Elem> expected_dinp(NC), expected_dw = dw_v;
    cpu::matmul_backward(kernel_pool(), expected_dinp.data(), expected_dw.data(), nullptr,
                         dout_v.data(), inp_v.data(), w_v.data(), N, C, OC);
    Tensor<Elem> dinp(nans<Elem>(NC), s.offset);
    matmul.backward_input(dinp.data(), dout.data(), weight.data(), N, C, OC);
    expect_call(CUBLASLT_EPILOGUE_DEFAULT, 0.0f, C, N, OC, "backward_input");
    expect_near(expected_dinp, dinp.values(), rel, "matmul_backward dinp");
    EXPECT_TRUE(dinp.guards_intact()) << "matmul_backward dinp";

    Tensor<Elem> dweight(dw_v, s.offset);
    matmul.backward_weight(dweight.data(), dout.data(), inp.data(), N, C, OC);
    expect_call(CUBLASLT_EPILOGUE_DEFAULT, 1.0f, C, OC, N, "backward_weight");
    expect_near(expected_dw, dweight.values(), rel, "matmul_backward dweight");
    EXPECT_TRUE(dweight.guards_intact()) << "matmul_backward dweight";

    EXPECT_TRUE(inp.guards_intact() && weight.guards_intact() && dout.guards_intact());
    EXPECT_TRUE(same_bits(inp.values(), inp_v) && same_bits(weight.values(), w_v) &&
                same_bits(dout.values(), dout_v) && same_bits(bias.values(), b_v))
        << "an input was written";
  }
  // Everything the class created, it destroyed.
  EXPECT_EQ(counters.handles, 0);
  EXPECT_EQ(counters.descs, 0);
  EXPECT_EQ(counters.layouts, 0);
  EXPECT_EQ(counters.preferences, 0);
  EXPECT_EQ(cuda_emulation::live_allocations(), 0);
}

// (7,16,12): leading dimensions that are multiples of 16 bytes; (9,30,37): odd ones; (64,32,48):
// a larger square-ish case. Each with a 256-byte aligned bias (the epilogue) and a bias one
// element off (the broadcast_rows fallback), and once with every tensor one element off.
const Shape kShapes[] = {
    {7, 16, 12, 0, 0},  {7, 16, 12, 0, 1},  {9, 30, 37, 0, 0}, {9, 30, 37, 0, 1},
    {64, 32, 48, 0, 0}, {64, 32, 48, 0, 1}, {9, 30, 37, 1, 1}, {64, 32, 48, 1, 0},
};

TEST(CublasLtEmulated, Fp32MatchesCpu) {
  for (const Shape& s : kShapes) expect_matmuls_match<float>(s, 2e-5);
}

TEST(CublasLtEmulated, Bf16MatchesCpu) {
  for (const Shape& s : kShapes) expect_matmuls_match<Bf16>(s, 2e-2);
}

TEST(CublasLtEmulated, EmptyProblemsDoNothing) {
  cuda::CublasLtMatmul matmul(nullptr);
  const int calls = cublaslt_emulation::counters().matmul_calls;
  float x = 1.0f;
  matmul.forward(&x, &x, &x, &x, 0, 4, 4);
  matmul.backward_input(&x, &x, &x, 0, 4, 4);
  matmul.backward_weight(&x, &x, &x, 4, 0, 4);
  EXPECT_EQ(cublaslt_emulation::counters().matmul_calls, calls);
  EXPECT_EQ(x, 1.0f);
}

// The stub itself, on a problem small enough to work out by hand: it must compute what the
// documentation says, independently of how cublaslt_matmul.cu uses it.
struct StubProblem {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~StubProblem() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

TEST(CublasLtStub, ComputesTheDocumentedColumnMajorProduct) {
  // m = 2, n = 2, k = 3. A is stored transposed: [k, m] = [3, 2] column-major, ld 4;
  // op(A) = A^T is [[1, 2, 3], [4, 5, 6]]. B is [k, n] = [3, 2], ld 3: columns (1, 0, 2)
  // and (0, 1, 1). D = op(A) B + bias (per row) + 0.5 D, ld 3.
  StubProblem p;
  ASSERT_EQ(cublasLtCreate(&p.handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  const int32_t t = CUBLAS_OP_T;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
            CUBLAS_STATUS_SUCCESS);
  const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue)),
            CUBLAS_STATUS_SUCCESS);
  alignas(256) const float bias[2] = {10, 20};
  const void* bias_ptr = bias;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                           sizeof(bias_ptr)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, 3, 2, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, 3, 2, 3), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, 2, 2, 3), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&p.pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(p.handle, p.desc, p.a, p.b, p.d, p.d, p.pref, 1, &result,
                                           &count),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(count, 1);
  alignas(256) const float a[8] = {1, 2, 3, -1, 4, 5, 6, -1};  // -1: padding (ld 4)
  alignas(256) const float b[6] = {1, 0, 2, 0, 1, 1};
  alignas(256) float d[6] = {2, 4, 99, 6, 8, 99};
  const float alpha = 1.0f, beta = 0.5f;
  ASSERT_EQ(cublasLtMatmul(p.handle, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d,
                           &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  // op(A) B = [[1 + 6, 2 + 3], [4 + 12, 5 + 6]] = [[7, 5], [16, 11]].
  EXPECT_EQ(d[0], 7 + 10 + 1);   // (0, 0)
  EXPECT_EQ(d[1], 16 + 20 + 2);  // (1, 0)
  EXPECT_EQ(d[2], 99);           // padding
  EXPECT_EQ(d[3], 5 + 10 + 3);   // (0, 1)
  EXPECT_EQ(d[4], 11 + 20 + 4);  // (1, 1)
  EXPECT_EQ(d[5], 99);
  // A pointer less aligned than the preference promised (256 bytes by default).
  EXPECT_EQ(cublasLtMatmul(p.handle, p.desc, &alpha, a + 1, p.a, b, p.b, &beta, d, p.d, d, p.d,
                           &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST(CublasLtStub, RejectsInconsistentLayouts) {
  StubProblem p;
  ASSERT_EQ(cublasLtCreate(&p.handle), CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t bad = nullptr;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&bad, CUDA_R_32F, 5, 3, 4), CUBLAS_STATUS_INVALID_VALUE);
  ASSERT_EQ(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&p.pref), CUBLAS_STATUS_SUCCESS);
  // op(A) = A is [4, 3] but B is [2, 5]: k disagrees.
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, 2, 5, 2), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, 4, 5, 4), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(p.handle, p.desc, p.a, p.b, p.d, p.d, p.pref, 1, &result,
                                           &count),
            CUBLAS_STATUS_INVALID_VALUE);
  // A transposed attribute of the wrong size.
  const int64_t t = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
            CUBLAS_STATUS_INVALID_VALUE);
}

}  // namespace
}  // namespace tandem
