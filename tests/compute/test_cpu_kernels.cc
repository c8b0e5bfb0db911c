// The CPU backend's GELU, attention and head RMSNorm kernels against double-precision
// references.
//
// GELU runs on a vectorised polynomial exp (fast_math.h) instead of libm's tanhf, and
// attention on a reorganised loop nest; these tests pin both to the math, not to the
// kernels' previous float results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/compute/cpu/fast_math.h"
#include "tandem/core/thread_pool.h"

namespace tandem::cpu {
namespace {

// The kernels' threads, shared by the tests of this file.
ThreadPool& kernel_pool() {
  static ThreadPool pool(2, false);
  return pool;
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCube = 0.044715;

double gelu_ref(double x) {
  // 0.5 x (1 + tanh(u)) written as x / (1 + exp(-2u)), which has no cancellation for
  // negative x; the identity is exact.
  const double u = kGeluScale * (x + kGeluCube * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}

// The two terms of GELU'(x) = 0.5 (1 + tanh(u)) + 0.5 x sech^2(u) u'(x)/sqrt(2/pi)...;
// for negative x they cancel, so the tolerance scales with their magnitudes.
struct GeluGradRef {
  double value;
  double magnitude;  // |first term| + |second term|
};

GeluGradRef gelu_grad_ref(double x) {
  const double u = kGeluScale * (x + kGeluCube * x * x * x);
  const double first = 1.0 / (1.0 + std::exp(-2.0 * u));
  const double sech = 1.0 / std::cosh(u);
  const double second = 0.5 * x * sech * sech * kGeluScale * (1.0 + 3.0 * kGeluCube * x * x);
  return {first + second, std::abs(first) + std::abs(second)};
}

// Rounding x to float and forming u in float perturbs u by a few ulp; exp(-2u)
// amplifies a relative error in u by |2u|, which no float implementation avoids (libm's
// included). So: relative tolerance 1e-6 times that condition number, plus an absolute
// floor for results at or below the denormal range.
double gelu_tolerance(double x, double magnitude, double floor) {
  const double u = kGeluScale * (x + kGeluCube * x * x * x);
  return 1e-6 * (1.0 + std::min(2.0 * std::abs(u), 1e6)) * magnitude + floor;
}
constexpr double kForwardFloor = 1e-37;
// For x below about -10 (-2u > 88) the backward kernel uses exp(88) in place of
// exp(-2u), to keep its intermediates finite; the true derivative is then below 1e-36
// and the kernel's at most ~1e-35 (x clamped to -20), hence this floor.
constexpr double kBackwardFloor = 1e-34;

std::vector<float> gelu_inputs() {
  std::vector<float> xs;
  for (int i = -150000; i <= 150000; i++) xs.push_back(static_cast<float>(i) * 1e-4f);  // +-15
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> log_mag(-8.0f, 6.0f);
  for (int i = 0; i < 20000; i++) {
    const float mag = std::pow(10.0f, log_mag(gen));
    xs.push_back(i % 2 == 0 ? mag : -mag);
  }
  const float big = std::numeric_limits<float>::max();
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-6f, -1e-6f, 30.0f, -30.0f, 1e10f, -1e10f, 1e20f,
                  -1e20f, big, -big}) {
    xs.push_back(x);
  }
  return xs;
}

TEST(CpuKernels, FastExpWithinTwoUlpOfDoubleExp) {
  for (float x = kExpMinArg; x <= 88.7f; x += 1e-3f) {
    const double ref = std::exp(static_cast<double>(x));
    const double got = fast_exp(x);
    ASSERT_LE(std::abs(got - ref), 2.0 * std::numeric_limits<float>::epsilon() * ref) << x;
  }
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_TRUE(std::isinf(fast_exp(kExpMaxArg)));  // overflows like expf
}

TEST(CpuKernels, GeluForwardMatchesDoubleReference) {
  const std::vector<float> xs = gelu_inputs();
  std::vector<float> out(xs.size());
  gelu_forward(kernel_pool(), out.data(), xs.data(), xs.size());
  for (size_t i = 0; i < xs.size(); i++) {
    const double x = xs[i];
    const double ref = gelu_ref(x);
    ASSERT_LE(std::abs(out[i] - ref), gelu_tolerance(x, std::abs(ref), kForwardFloor))
        << "x = " << xs[i];
  }
}

TEST(CpuKernels, GeluBackwardMatchesDoubleReference) {
  const std::vector<float> xs = gelu_inputs();
  // dout of 1 tests GELU' itself; a second pass with random dout tests the product.
  std::vector<float> ones(xs.size(), 1.0f), dinp(xs.size());
  gelu_backward(kernel_pool(), dinp.data(), xs.data(), ones.data(), xs.size());
  for (size_t i = 0; i < xs.size(); i++) {
    const GeluGradRef ref = gelu_grad_ref(xs[i]);
    ASSERT_LE(std::abs(dinp[i] - ref.value), gelu_tolerance(xs[i], ref.magnitude, kBackwardFloor))
        << "x = " << xs[i];
  }
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  std::vector<float> dout(xs.size());
  for (float& d : dout) d = normal(gen);
  gelu_backward(kernel_pool(), dinp.data(), xs.data(), dout.data(), xs.size());
  for (size_t i = 0; i < xs.size(); i++) {
    const GeluGradRef ref = gelu_grad_ref(xs[i]);
    const double tol = gelu_tolerance(xs[i], ref.magnitude, kBackwardFloor) * std::abs(dout[i]);
    ASSERT_LE(std::abs(dinp[i] - ref.value * dout[i]), tol) << "x = " << xs[i];
  }
}

TEST(CpuKernels, GeluPropagatesNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float one = 1.0f;
  float out = 0.0f;
  gelu_forward(kernel_pool(), &out, &nan, 1);
  EXPECT_TRUE(std::isnan(out));
  gelu_backward(kernel_pool(), &out, &nan, &one, 1);
  EXPECT_TRUE(std::isnan(out));
}

// Straightforward causal attention in double: full T x T probabilities per head.
struct AttentionRef {
  std::vector<double> out, lse, dqkv;
};

// Grouped-query heads: qkv rows [NH query | KVH key | KVH value] heads of hs, query head h
// reading key/value head h / (NH / KVH).
AttentionRef attention_ref(const std::vector<float>& qkv, const std::vector<float>& dout, int B,
                           int T, int C, int NH, int KVH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const size_t W = static_cast<size_t>(NH + 2 * KVH) * hs;
  // part 0: query head h; 1, 2: the key and value heads query head h reads.
  auto at = [&](int b, int t, int part, int h, int i) {
    const int g = h / (NH / KVH);
    const int head = part == 0 ? h : part == 1 ? NH + g : NH + KVH + g;
    return (static_cast<size_t>(b) * T + t) * W + static_cast<size_t>(head) * hs + i;
  };
  AttentionRef r{std::vector<double>(static_cast<size_t>(B) * T * C),
                 std::vector<double>(static_cast<size_t>(B) * NH * T),
                 std::vector<double>(qkv.size(), 0.0)};
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      std::vector<double> P(static_cast<size_t>(T) * T, 0.0);  // P[t][t2], causal
      for (int t = 0; t < T; t++) {
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int t2 = 0; t2 <= t; t2++) {
          double d = 0.0;
          for (int i = 0; i < hs; i++)
            d += double(qkv[at(b, t, 0, h, i)]) * qkv[at(b, t2, 1, h, i)];
          s[t2] = d * scale;
          mx = std::max(mx, s[t2]);
        }
        double sum = 0.0;
        for (int t2 = 0; t2 <= t; t2++) sum += std::exp(s[t2] - mx);
        r.lse[(static_cast<size_t>(b) * NH + h) * T + t] = mx + std::log(sum);
        for (int t2 = 0; t2 <= t; t2++) P[t * T + t2] = std::exp(s[t2] - mx) / sum;
        for (int i = 0; i < hs; i++) {
          double o = 0.0;
          for (int t2 = 0; t2 <= t; t2++) o += P[t * T + t2] * qkv[at(b, t2, 2, h, i)];
          r.out[(static_cast<size_t>(b) * T + t) * C + h * hs + i] = o;
        }
      }
      // Backward: dP = dout v^T, dS = P (dP - rowsum(P dP)), dq = dS k scale,
      // dk = dS^T q scale, dv = P^T dout.
      for (int t = 0; t < T; t++) {
        const float* d_o = &dout[(static_cast<size_t>(b) * T + t) * C + h * hs];
        std::vector<double> dP(t + 1);
        double rowsum = 0.0;
        for (int t2 = 0; t2 <= t; t2++) {
          double d = 0.0;
          for (int i = 0; i < hs; i++) d += double(d_o[i]) * qkv[at(b, t2, 2, h, i)];
          dP[t2] = d;
          rowsum += P[t * T + t2] * d;
        }
        for (int t2 = 0; t2 <= t; t2++) {
          const double p = P[t * T + t2];
          const double dS = p * (dP[t2] - rowsum) * scale;
          for (int i = 0; i < hs; i++) {
            r.dqkv[at(b, t, 0, h, i)] += dS * qkv[at(b, t2, 1, h, i)];
            r.dqkv[at(b, t2, 1, h, i)] += dS * qkv[at(b, t, 0, h, i)];
            r.dqkv[at(b, t2, 2, h, i)] += p * d_o[i];
          }
        }
      }
    }
  }
  return r;
}

// Float vs double: each kernel output is a short sum of O(1) terms, so the error is a
// few float ulps of the terms' size; 2e-6 * (1 + |ref|) bounds it with margin, `terms`
// times that for outputs that add up that many such sums (a key/value head's gradient
// sums its query heads').
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, const char* what,
                  int terms = 1) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); i++) {
    ASSERT_NEAR(got[i], ref[i], terms * 2e-6 * (1.0 + std::abs(ref[i]))) << what << "[" << i << "]";
  }
}

void check_attention(int B, int T, int C, int NH, int KVH) {
  SCOPED_TRACE(::testing::Message()
               << "B " << B << " T " << T << " C " << C << " NH " << NH << " KVH " << KVH);
  std::mt19937 gen(1234);
  // Spread 1.5: softmax rows far from uniform, so the probabilities matter.
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const int hs = C / NH;
  std::vector<float> qkv(static_cast<size_t>(B) * T * (NH + 2 * KVH) * hs),
      dout(static_cast<size_t>(B) * T * C);
  for (float& v : qkv) v = normal(gen);
  for (float& v : dout) v = normal(gen);
  const AttentionRef ref = attention_ref(qkv, dout, B, T, C, NH, KVH);

  // Each score sums hs products in fp32: its rounding error grows with hs.
  const int score_terms = std::max(1, hs / 8);
  std::vector<float> out(dout.size()), lse(static_cast<size_t>(B) * NH * T);
  attention_forward(kernel_pool(), out.data(), lse.data(), qkv.data(), B, T, NH, KVH, hs);
  expect_close(out, ref.out, "out", score_terms);
  expect_close(lse, ref.lse, "lse", score_terms);

  // Start from garbage: the kernel overwrites dqkv.
  std::vector<float> dqkv(qkv.size(), 123.0f);
  attention_backward(kernel_pool(), dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
                     T, NH, KVH, hs);
  expect_close(dqkv, ref.dqkv, "dqkv", NH / KVH * score_terms);
}

TEST(CpuKernels, AttentionMatchesDoubleReference) { check_attention(2, 9, 16, 2, 2); }

// hs = 6: not a multiple of the kernel's 4-row blocking, so its remainder path runs.
TEST(CpuKernels, AttentionMatchesDoubleReferenceOddHeadSize) { check_attention(2, 9, 12, 2, 2); }

// Grouped-query heads (a key/value head's gradient sums its query heads'), multi-query
// (one key/value head), and every remainder of the kernel's blocks of 4 queries (T = 8..11).
TEST(CpuKernels, GroupedQueryAttentionMatchesDoubleReference) {
  for (int T : {8, 9, 10, 11}) check_attention(2, T, 24, 4, 2);
  check_attention(1, 13, 24, 4, 1);
  check_attention(1, 7, 18, 6, 3);
}

// Head sizes that take every column path of the sums over keys (16 columns at a time, then
// 8, then one): hs = 27 = 16 + 8 + 3 and hs = 40 = 16 + 16 + 8, over rows past several
// blocks of 4 keys and queries.
TEST(CpuKernels, AttentionMatchesDoubleReferenceAtWideHeads) {
  check_attention(2, 37, 54, 2, 1);
  check_attention(1, 21, 160, 4, 4);
}

}  // namespace
}  // namespace tandem::cpu

namespace tandem::cpu {
namespace {

// head_rmsnorm (Qwen3's q and k norms) against a double reference: H heads of HS columns in
// rows of `stride` columns whose other columns hold sentinels the kernels must not touch;
// the backward pass both into another buffer and in place (dinp = dout), the weight
// gradient accumulated onto a non-zero start.
TEST(CpuKernels, HeadRmsNormMatchesDoubleReferenceAndLeavesOtherColumns) {
  const int N = 7, H = 3, HS = 10, stride = 47, offset = 5;  // heads at columns [5, 35)
  const float eps = 1e-6f, sentinel = 1234.5f;
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(N * stride), dout(N * stride), weight(HS);
  for (float& v : x) v = normal(gen);
  for (float& v : dout) v = normal(gen);
  for (float& v : weight) v = 1.0f + 0.3f * normal(gen);
  std::vector<float> out(N * stride, sentinel), rstd(N * H);
  head_rmsnorm_forward(kernel_pool(), out.data() + offset, rstd.data(), x.data() + offset,
                       weight.data(), eps, N, H, HS, stride);

  std::vector<double> want_dw(HS, 0.25);
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < stride; c++) {
      const bool in_head = c >= offset && c < offset + H * HS;
      if (!in_head) {
        ASSERT_EQ(out[n * stride + c], sentinel) << n << ", " << c;
      }
    }
    for (int h = 0; h < H; h++) {
      const size_t at = static_cast<size_t>(n) * stride + offset + h * HS;
      double square = 0.0;
      for (int c = 0; c < HS; c++) square += static_cast<double>(x[at + c]) * x[at + c];
      const double s = 1.0 / std::sqrt(square / HS + eps);
      EXPECT_NEAR(rstd[n * H + h], s, 1e-6 * s);
      for (int c = 0; c < HS; c++) {
        const double y = x[at + c] * s * weight[c];
        EXPECT_NEAR(out[at + c], y, 1e-5 * (1.0 + std::fabs(y)));
        want_dw[c] += static_cast<double>(dout[at + c]) * x[at + c] * s;
      }
    }
  }

  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "into another buffer");
    std::vector<float> grad = in_place ? dout : std::vector<float>(N * stride, sentinel);
    std::vector<float> dweight(HS, 0.25f);
    const std::vector<float> dout_copy = dout;
    head_rmsnorm_backward(kernel_pool(), grad.data() + offset, dweight.data(),
                          (in_place ? grad.data() : dout_copy.data()) + offset, x.data() + offset,
                          weight.data(), rstd.data(), N, H, HS, stride);
    for (int c = 0; c < HS; c++)
      EXPECT_NEAR(dweight[c], want_dw[c], 1e-4 * (1.0 + std::fabs(want_dw[c]))) << "dweight " << c;
    for (int n = 0; n < N; n++) {
      for (int c = 0; c < stride; c++) {
        const bool in_head = c >= offset && c < offset + H * HS;
        if (!in_head) {
          ASSERT_EQ(grad[n * stride + c], in_place ? dout[n * stride + c] : sentinel)
              << n << ", " << c;
        }
      }
      for (int h = 0; h < H; h++) {
        const size_t at = static_cast<size_t>(n) * stride + offset + h * HS;
        double square = 0.0, dot = 0.0;
        for (int c = 0; c < HS; c++) {
          square += static_cast<double>(x[at + c]) * x[at + c];
          dot += static_cast<double>(dout[at + c]) * weight[c] * x[at + c];
        }
        const double s = 1.0 / std::sqrt(square / HS + eps);
        for (int c = 0; c < HS; c++) {
          // d(x s w)/dx applied to dout: (dout w - x s^2 (sum of dout w x) / HS) s
          const double want = (dout[at + c] * weight[c] - x[at + c] * s * s * dot / HS) * s;
          EXPECT_NEAR(grad[at + c], want, 1e-5 * (1.0 + std::fabs(want)))
              << n << ", " << h << ", " << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cpu
