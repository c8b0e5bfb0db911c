// The real flash-attention kernels (src/tandem/compute/cuda/flash_attention.cu), compiled
// as plain C++ and run on the CPU by the SIMT emulator in tests/cuda_emulation/ (see its
// README.md), so that they are tested on every machine, GPU or not. The build generates the
// emulated source from the current flash_attention.cu; only its "Hardware primitives"
// section (PTX and the kernel launch) is replaced.
//
// Each case runs the forward and backward passes and compares out, lse, dq, dk and dv with
// a double-precision naive attention. The cases cover both implementations: tensor cores
// (bf16, head size a multiple of 8, aligned tensors) and SIMT (fp32; bf16 with other head
// sizes or misaligned tensors), every head-tile width (16, 32, 64 and 128, with the
// 32-row backward steps), T of 1, below, at and past tile boundaries, several batches
// and heads, and grouped-query heads (KVH < NH, multi-query KVH = 1) on every path. Races
// show up as results that differ between thread schedules.
//
// TANDEM_EMULATION_LONG=1 also runs the Long cases (T = 1000 and 1024: about a minute);
// without it they are reported as skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_emulation/simt_emulator.h"
#include "tandem/compute/cuda/flash_attention.cuh"
#include "tandem/core/error.h"
#include "tandem/core/half.h"

namespace tandem::cuda {
namespace {

using cuda_emulation::Schedule;

enum class Dtype { kF32, kBf16 };

struct Case {
  Dtype dtype;
  int B, T, NH, hs;
  bool misaligned = false;  // tensors one element past 16-byte alignment: bf16 takes SIMT
  Schedule schedule = Schedule::kRoundRobin;
  // 0: the backward pass gets the scratch it asks for (every head's dS tiles here); n: only
  // room for the dS tiles of n key/value heads' groups of query heads (n heads with KVH =
  // NH), so it runs in chunks of key/value heads.
  int scratch_heads = 0;
  int KVH = 0;  // key/value heads; 0: NH (multi-head attention)

  int kv_heads() const { return KVH > 0 ? KVH : NH; }
};

std::string name(const Case& c) {
  std::string s = std::string(c.dtype == Dtype::kBf16 ? "bf16" : "f32") + "_B" +
                  std::to_string(c.B) + "_T" + std::to_string(c.T) + "_NH" + std::to_string(c.NH) +
                  "_hs" + std::to_string(c.hs);
  if (c.kv_heads() != c.NH) s += "_KVH" + std::to_string(c.kv_heads());
  if (c.misaligned) s += "_misaligned";
  if (c.scratch_heads > 0) s += "_chunks_of_" + std::to_string(c.scratch_heads);
  return s + "_" + cuda_emulation::schedule_name(c.schedule);
}

// For gtest's messages: the case behind a failure.
void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

// Round robin: each implementation, head tile and tile-boundary case.
std::vector<Case> base_cases() {
  std::vector<Case> cases;
  const Case sizes[] = {
      {Dtype::kF32, 2, 9, 4, 8},     // several batches and heads; head tile 16
      {Dtype::kF32, 1, 1, 1, 8},     // T = 1
      {Dtype::kF32, 1, 64, 2, 16},   // exactly one tile
      {Dtype::kF32, 1, 130, 2, 64},  // three tiles, the last with 2 rows
      {Dtype::kF32, 1, 65, 1, 128},  // head tile 128 (32-row backward steps for bf16)
      {Dtype::kF32, 1, 97, 1, 40},   // head size below its tile (64)
      {Dtype::kF32, 1, 70, 2, 12},   // head size not a multiple of 8: bf16 takes SIMT
      {Dtype::kF32, 1, 200, 1, 32},  // four tiles; head tile 32
  };
  for (Dtype dtype : {Dtype::kF32, Dtype::kBf16}) {
    for (Case c : sizes) {
      c.dtype = dtype;
      cases.push_back(c);
    }
  }
  cases.push_back({Dtype::kBf16, 1, 70, 2, 16, /*misaligned=*/true});  // bf16 on SIMT
  cases.push_back({Dtype::kF32, 1, 70, 2, 16, /*misaligned=*/true});
  return cases;
}

std::vector<Case> with_schedule(std::vector<Case> cases, Schedule schedule) {
  for (Case& c : cases) c.schedule = schedule;
  return cases;
}

// One case per implementation and head tile, for the schedules other than round robin.
std::vector<Case> schedule_cases(Schedule schedule) {
  return with_schedule({{Dtype::kBf16, 2, 9, 4, 8},
                        {Dtype::kBf16, 1, 130, 1, 64},
                        {Dtype::kBf16, 1, 65, 1, 128},
                        {Dtype::kF32, 1, 70, 2, 12},
                        {Dtype::kF32, 1, 130, 1, 64},
                        {Dtype::kBf16, 1, 70, 2, 16, /*misaligned=*/true}},
                       schedule);
}

// Several tiles per head: 3 to 8 query tiles, so the online softmax rescales and the
// double-buffered loops run many steps.
std::vector<Case> larger_cases() {
  std::vector<Case> cases;
  for (Dtype dtype : {Dtype::kF32, Dtype::kBf16}) {
    for (Case c : {Case{dtype, 2, 300, 2, 64}, Case{dtype, 1, 257, 1, 128},
                   Case{dtype, 1, 191, 3, 24}, Case{dtype, 1, 512, 1, 64}}) {
      for (Schedule schedule : {Schedule::kRoundRobin, Schedule::kRandom}) {
        c.schedule = schedule;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// The dq pass reads the dS tiles the dk/dv pass stored: many query tiles per head (each
// reading every key tile up to the diagonal), T just past a tile, head sizes from 8 to 128
// on both paths, and the backward pass in chunks of one head (scratch for one head's dS
// tiles) with several batches and heads, so that a chunk's offsets into the heads and into
// the scratch are both exercised.
std::vector<Case> dq_cases() {
  std::vector<Case> cases;
  for (Dtype dtype : {Dtype::kF32, Dtype::kBf16}) {
    cases.push_back({dtype, 1, 150, 2, 8});   // 3 query tiles at the smallest head size
    cases.push_back({dtype, 1, 140, 1, 96});  // head size below its tile (128), 3 tiles
    cases.push_back({dtype, 1, 1, 3, 64});    // T = 1: one key, dS = 0
    Case chunked{dtype, 2, 130, 3, 32};       // 6 heads, one per chunk
    chunked.scratch_heads = 1;
    cases.push_back(chunked);
    chunked = {dtype, 1, 200, 2, 128};
    chunked.scratch_heads = 1;
    chunked.schedule = Schedule::kRandom;
    cases.push_back(chunked);
  }
  Case misaligned{Dtype::kBf16, 2, 100, 2, 16, /*misaligned=*/true};  // bf16 SIMT, chunked
  misaligned.scratch_heads = 1;
  cases.push_back(misaligned);
  return cases;
}

// Grouped-query heads (query head h reads key/value head h / (NH / KVH)) on every path:
// groups of 2 and 3, multi-query (KVH = 1), tensor cores at head tiles 16, 64 and 128 (the
// 32-row backward steps cross from one query head to the next mid-buffer), SIMT in fp32
// and in bf16 (head size 12, misaligned), several query tiles, and the backward pass in
// chunks of one key/value head's group.
std::vector<Case> gqa_cases() {
  std::vector<Case> cases;
  const auto gqa = [](Dtype dtype, int B, int T, int NH, int hs, int KVH) {
    Case c{dtype, B, T, NH, hs};
    c.KVH = KVH;
    return c;
  };
  for (Dtype dtype : {Dtype::kF32, Dtype::kBf16}) {
    cases.push_back(gqa(dtype, 2, 9, 4, 8, 2));     // several batches, groups of 2
    cases.push_back(gqa(dtype, 1, 130, 4, 64, 1));  // multi-query, three tiles
    cases.push_back(gqa(dtype, 1, 97, 6, 16, 2));   // groups of 3
    cases.push_back(gqa(dtype, 1, 70, 4, 12, 2));   // head size 12: bf16 takes SIMT
    Case chunked = gqa(dtype, 2, 130, 4, 32, 2);    // 4 key/value heads, one per chunk
    chunked.scratch_heads = 1;
    chunked.schedule = Schedule::kRandom;
    cases.push_back(chunked);
  }
  cases.push_back(gqa(Dtype::kBf16, 1, 77, 4, 128, 2));  // 32-row steps
  Case misaligned = gqa(Dtype::kBf16, 1, 70, 4, 16, 1);  // bf16 on SIMT
  misaligned.misaligned = true;
  cases.push_back(misaligned);
  for (Schedule schedule : {Schedule::kLowestFirst, Schedule::kHighestFirst}) {
    Case c = gqa(Dtype::kBf16, 1, 130, 4, 32, 2);
    c.schedule = schedule;
    cases.push_back(c);
    c.dtype = Dtype::kF32;
    cases.push_back(c);
  }
  return cases;
}

// GPT-2's sequence length, under every schedule: about a minute, so only on request.
std::vector<Case> long_cases() {
  std::vector<Case> cases;
  for (Dtype dtype : {Dtype::kF32, Dtype::kBf16}) {
    for (Case c : {Case{dtype, 1, 1024, 2, 64}, Case{dtype, 1, 1000, 1, 128}}) {
      for (Schedule schedule : {Schedule::kRoundRobin, Schedule::kLowestFirst,
                                Schedule::kHighestFirst, Schedule::kRandom}) {
        c.schedule = schedule;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

double as_double(float x) { return x; }
double as_double(Bf16 x) { return to_float(x); }

// Tensors as the kernels take them, possibly one element past 16-byte alignment.
template <typename T>
class Tensor {
 public:
  Tensor(size_t n, bool misaligned, T fill) : storage_(n + 1, fill), offset_(misaligned ? 1 : 0) {
    static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= 16, "vector storage is 16-byte aligned");
  }
  T* data() { return storage_.data() + offset_; }
  const T* data() const { return storage_.data() + offset_; }
  size_t size() const { return storage_.size() - 1; }
  T& operator[](size_t i) { return data()[i]; }
  T operator[](size_t i) const { return data()[i]; }

 private:
  std::vector<T> storage_;
  size_t offset_;
};

template <typename Elem>
struct Inputs {
  Tensor<Elem> qkv, dout;
};

template <typename Elem>
struct Outputs {
  Tensor<Elem> out, dqkv;
  Tensor<float> lse;
};

// Columns of a qkv row: NH query heads, then KVH key heads, then KVH value heads.
size_t qkv_width(const Case& c) { return static_cast<size_t>(c.NH + 2 * c.kv_heads()) * c.hs; }

// Random q, k, v (a wide spread, for peaked softmax rows) and dout for case c.
template <typename Elem>
Inputs<Elem> random_inputs(const Case& c) {
  const size_t C = static_cast<size_t>(c.NH) * c.hs, rows = static_cast<size_t>(c.B) * c.T;
  Inputs<Elem> in{Tensor<Elem>(rows * qkv_width(c), c.misaligned, Elem{}),
                  Tensor<Elem>(rows * C, c.misaligned, Elem{})};
  std::mt19937 rng(static_cast<unsigned>(1000003 * c.B + 1009 * c.T + 101 * c.NH + c.hs));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < in.qkv.size(); i++) in.qkv[i] = from_float<Elem>(1.5f * normal(rng));
  for (size_t i = 0; i < in.dout.size(); i++) in.dout[i] = from_float<Elem>(normal(rng));
  return in;
}

// One query head's dS tiles in the backward scratch: a 64 x 64 tile per (query tile, key
// tile <= query tile).
template <typename Elem>
size_t head_ds_bytes(int T) {
  const size_t tiles = (static_cast<size_t>(T) + 63) / 64;
  return sizeof(Elem) * tiles * (tiles + 1) / 2 * 64 * 64;
}

// Forward, then backward from the forward's out and lse, under c.schedule. The outputs
// start as NaN, so an element no thread writes fails the comparisons.
template <typename Elem>
Outputs<Elem> run_kernels(const Case& c, const Inputs<Elem>& in) {
  const int C = c.NH * c.hs;
  const Elem nan = from_float<Elem>(NAN);
  Outputs<Elem> o{Tensor<Elem>(in.dout.size(), c.misaligned, nan),
                  Tensor<Elem>(in.qkv.size(), c.misaligned, nan),
                  Tensor<float>(static_cast<size_t>(c.B) * c.NH * c.T, false, NAN)};
  const int KVH = c.kv_heads(), group = c.NH / KVH;
  cuda_emulation::set_schedule(c.schedule, /*seed=*/12345);
  flash_attention_forward<Elem>(o.out.data(), o.lse.data(), in.qkv.data(), c.B, c.T, C, c.NH, KVH,
                                nullptr);
  // NaN bytes, so that a dS element the dk/dv pass leaves unwritten fails the comparisons.
  const size_t scratch_bytes =
      c.scratch_heads == 0
          ? flash_attention_backward_scratch_bytes<Elem>(c.B, c.T, C, c.NH, KVH)
          : flash_attention_backward_min_scratch_bytes<Elem>(c.B, c.T, C, c.NH, KVH) +
                (c.scratch_heads - 1) * group * head_ds_bytes<Elem>(c.T);
  std::vector<uint64_t> scratch((scratch_bytes + 7) / 8, ~uint64_t{0});  // 8-byte aligned
  flash_attention_backward<Elem>(o.dqkv.data(), scratch.data(), scratch_bytes, in.dout.data(),
                                 in.qkv.data(), o.out.data(), o.lse.data(), c.B, c.T, C, c.NH, KVH,
                                 nullptr);
  cuda_emulation::set_schedule(Schedule::kRoundRobin);
  return o;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Naive causal attention in double precision, query head h with key/value head
// h / (NH / KVH); a key/value head's dk and dv gather its query heads'. The backward pass
// uses the kernels' own forward output in D = dout . out, as flash_attention_backward does.
Reference reference(const std::vector<double>& qkv, const std::vector<double>& dout,
                    const std::vector<double>& out_used, const Case& c) {
  const int B = c.B, T = c.T, NH = c.NH, KVH = c.kv_heads(), hs = c.hs, C = NH * hs;
  const size_t W = qkv_width(c);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Reference r;
  const size_t rows = static_cast<size_t>(B) * T;
  r.out.assign(rows * C, 0);
  r.dq.assign(rows * C, 0);
  r.dk.assign(rows * KVH * hs, 0);
  r.dv.assign(rows * KVH * hs, 0);
  r.lse.assign(static_cast<size_t>(B) * NH * T, 0);
  // Column offsets in a qkv row: query head h, key head g, value head g.
  const auto q = [&](int b, int t, int h, int d) {
    return qkv[(static_cast<size_t>(b) * T + t) * W + h * hs + d];
  };
  const auto k = [&](int b, int t, int g, int d) {
    return qkv[(static_cast<size_t>(b) * T + t) * W + (NH + g) * hs + d];
  };
  const auto v = [&](int b, int t, int g, int d) {
    return qkv[(static_cast<size_t>(b) * T + t) * W + (NH + KVH + g) * hs + d];
  };
  const auto row = [&](int b, int t, int h) {  // in out, dout, dq
    return (static_cast<size_t>(b) * T + t) * C + h * hs;
  };
  const auto kv_row = [&](int b, int t, int g) {  // in dk, dv
    return (static_cast<size_t>(b) * T + t) * KVH * hs + g * hs;
  };
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const int g = h / (NH / KVH);
      std::vector<std::vector<double>> P(T, std::vector<double>(T, 0.0));
      for (int t = 0; t < T; t++) {
        std::vector<double> s(t + 1);
        double m = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          double dot = 0;
          for (int d = 0; d < hs; d++) dot += q(b, t, h, d) * k(b, t2, g, d);
          s[t2] = dot * scale;
          m = std::max(m, s[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; t2++) sum += std::exp(s[t2] - m);
        for (int t2 = 0; t2 <= t; t2++) P[t][t2] = std::exp(s[t2] - m) / sum;
        r.lse[(static_cast<size_t>(b) * NH + h) * T + t] = m + std::log(sum);
        for (int d = 0; d < hs; d++) {
          double o = 0;
          for (int t2 = 0; t2 <= t; t2++) o += P[t][t2] * v(b, t2, g, d);
          r.out[row(b, t, h) + d] = o;
        }
      }
      for (int t = 0; t < T; t++) {
        const size_t o = row(b, t, h);
        double D = 0;
        for (int d = 0; d < hs; d++) D += dout[o + d] * out_used[o + d];
        for (int t2 = 0; t2 <= t; t2++) {
          double dp = 0;
          for (int d = 0; d < hs; d++) dp += dout[o + d] * v(b, t2, g, d);
          const double ds = P[t][t2] * (dp - D) * scale;
          for (int d = 0; d < hs; d++) {
            r.dq[o + d] += ds * k(b, t2, g, d);
            r.dk[kv_row(b, t2, g) + d] += ds * q(b, t, h, d);
            r.dv[kv_row(b, t2, g) + d] += P[t][t2] * dout[o + d];
          }
        }
      }
    }
  }
  return r;
}

// max |got - want| <= tol * max |want|, and no NaN (an element the kernels never wrote).
::testing::AssertionResult close(const char* what, const std::vector<double>& got,
                                 const std::vector<double>& want, double tol) {
  double scale = 0, err = 0;
  size_t worst = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); i++) {
    if (std::isnan(got[i])) {
      return ::testing::AssertionFailure() << what << "[" << i << "] is NaN (never written, or "
                                           << "computed from unwritten shared memory)";
    }
    const double e = std::fabs(got[i] - want[i]);
    if (e > err) err = e, worst = i;
  }
  const double relative = err / std::max(scale, 1e-30);
  if (relative <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": max error " << relative << " of max |reference| " << scale << " (limit "
         << tol << "), worst at " << worst << ": got " << got[worst] << ", want " << want[worst];
}

template <typename Elem>
void expect_matches_reference_as(const Case& c) {
  const Inputs<Elem> in = random_inputs<Elem>(c);
  const Outputs<Elem> o = run_kernels<Elem>(c, in);
  const size_t C = static_cast<size_t>(c.NH) * c.hs, rows = static_cast<size_t>(c.B) * c.T;
  const size_t W = qkv_width(c), KC = static_cast<size_t>(c.kv_heads()) * c.hs;
  const auto doubles = [](const auto& tensor, size_t begin, size_t count, size_t stride,
                          size_t width) {  // `count` rows of `width` at `begin` + i * stride
    std::vector<double> v;
    for (size_t i = 0; i < count; i++) {
      for (size_t j = 0; j < width; j++) v.push_back(as_double(tensor[begin + i * stride + j]));
    }
    return v;
  };
  const Reference r = reference(doubles(in.qkv, 0, rows, W, W), doubles(in.dout, 0, rows, C, C),
                                doubles(o.out, 0, rows, C, C), c);
  const bool bf16 = std::is_same_v<Elem, Bf16>;
  EXPECT_TRUE(close("out", doubles(o.out, 0, rows, C, C), r.out, bf16 ? 2e-2 : 2e-5));
  EXPECT_TRUE(close("lse", doubles(o.lse, 0, o.lse.size(), 1, 1), r.lse, bf16 ? 1e-4 : 2e-6));
  // dq, dk and dv separately: their scales differ.
  const double grad_tol = bf16 ? 3e-2 : 5e-5;
  EXPECT_TRUE(close("dq", doubles(o.dqkv, 0, rows, W, C), r.dq, grad_tol));
  EXPECT_TRUE(close("dk", doubles(o.dqkv, C, rows, W, KC), r.dk, grad_tol));
  EXPECT_TRUE(close("dv", doubles(o.dqkv, C + KC, rows, W, KC), r.dv, grad_tol));
}

void expect_matches_reference(const Case& c) {
  SCOPED_TRACE(name(c));
  if (c.dtype == Dtype::kBf16) {
    expect_matches_reference_as<Bf16>(c);
  } else {
    expect_matches_reference_as<float>(c);
  }
}

bool long_cases_enabled() {
  const char* v = std::getenv("TANDEM_EMULATION_LONG");
  return v != nullptr && std::string(v) != "" && std::string(v) != "0";
}

class FlashAttentionEmulated : public ::testing::TestWithParam<Case> {};

TEST_P(FlashAttentionEmulated, MatchesReference) { expect_matches_reference(GetParam()); }

std::string param_name(const ::testing::TestParamInfo<Case>& info) { return name(info.param); }

INSTANTIATE_TEST_SUITE_P(RoundRobin, FlashAttentionEmulated, ::testing::ValuesIn(base_cases()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(LowestFirst, FlashAttentionEmulated,
                         ::testing::ValuesIn(schedule_cases(Schedule::kLowestFirst)), param_name);
INSTANTIATE_TEST_SUITE_P(HighestFirst, FlashAttentionEmulated,
                         ::testing::ValuesIn(schedule_cases(Schedule::kHighestFirst)), param_name);
INSTANTIATE_TEST_SUITE_P(Random, FlashAttentionEmulated,
                         ::testing::ValuesIn(schedule_cases(Schedule::kRandom)), param_name);
INSTANTIATE_TEST_SUITE_P(Larger, FlashAttentionEmulated, ::testing::ValuesIn(larger_cases()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(StoredDs, FlashAttentionEmulated, ::testing::ValuesIn(dq_cases()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(GroupedQuery, FlashAttentionEmulated, ::testing::ValuesIn(gqa_cases()),
                         param_name);

// One test for all of them, so that by default one line reports them skipped.
TEST(FlashAttentionEmulatedLong, GptSizesUnderEverySchedule) {
  if (!long_cases_enabled()) GTEST_SKIP() << "set TANDEM_EMULATION_LONG=1 to run the long cases";
  for (const Case& c : long_cases()) expect_matches_reference(c);
}

// The kernels are deterministic by design (one writer per element, fixed summation
// orders), so every schedule must give the same bits; a difference is a race, which the
// reference comparison might tolerate as rounding.
template <typename Elem>
void expect_same_bits_under_every_schedule(Case c) {
  const Inputs<Elem> in = random_inputs<Elem>(c);
  c.schedule = Schedule::kRoundRobin;
  const Outputs<Elem> first = run_kernels<Elem>(c, in);
  for (Schedule schedule : {Schedule::kLowestFirst, Schedule::kHighestFirst, Schedule::kRandom}) {
    c.schedule = schedule;
    const Outputs<Elem> o = run_kernels<Elem>(c, in);
    const auto same = [&](const char* what, const auto& a, const auto& b) {
      for (size_t i = 0; i < a.size(); i++) {
        if (std::memcmp(a.data() + i, b.data() + i, sizeof(a[i])) != 0) {
          ADD_FAILURE() << what << "[" << i << "] differs between schedules round_robin ("
                        << as_double(a[i]) << ") and " << cuda_emulation::schedule_name(schedule)
                        << " (" << as_double(b[i]) << ")";
          return;
        }
      }
    };
    same("out", first.out, o.out);
    same("lse", first.lse, o.lse);
    same("dqkv", first.dqkv, o.dqkv);
  }
}

// The backward pass in chunks of heads (less scratch) computes each head as it does in
// one launch: the same bits, whether the chunks divide the heads evenly or not.
template <typename Elem>
void expect_same_bits_in_chunks(Case c, std::initializer_list<int> scratch_heads) {
  const Inputs<Elem> in = random_inputs<Elem>(c);
  c.scratch_heads = 0;
  const Outputs<Elem> whole = run_kernels<Elem>(c, in);
  for (int heads : scratch_heads) {
    c.scratch_heads = heads;
    const Outputs<Elem> chunked = run_kernels<Elem>(c, in);
    ASSERT_EQ(whole.dqkv.size(), chunked.dqkv.size());
    for (size_t i = 0; i < whole.dqkv.size(); i++) {
      ASSERT_EQ(std::memcmp(whole.dqkv.data() + i, chunked.dqkv.data() + i, sizeof(Elem)), 0)
          << "dqkv[" << i << "]: " << as_double(whole.dqkv[i]) << " in one launch, "
          << as_double(chunked.dqkv[i]) << " in chunks of " << heads << " heads";
    }
  }
}

TEST(FlashAttentionEmulatedDeterminism, SameBitsInChunksOfHeads) {
  // 5 heads in chunks of 1; of 2, 2 and 1 (room for 2); of 3 and 2 (room for 4: chunks
  // are evened out).
  expect_same_bits_in_chunks<Bf16>(Case{Dtype::kBf16, 1, 70, 5, 32}, {1, 2, 4});
  expect_same_bits_in_chunks<float>(Case{Dtype::kF32, 1, 70, 5, 24}, {1, 2, 4});
  // Grouped-query: 3 key/value heads of 2 query heads each, in chunks of 1 (2 query heads);
  // of 2 and 1 (room for 2 groups).
  Case gqa{Dtype::kBf16, 1, 70, 6, 32};
  gqa.KVH = 3;
  expect_same_bits_in_chunks<Bf16>(gqa, {1, 2});
  gqa.dtype = Dtype::kF32;
  gqa.hs = 24;
  expect_same_bits_in_chunks<float>(gqa, {1, 2});
}

TEST(FlashAttentionEmulatedDeterminism, SameBitsUnderEverySchedule) {
  Case gqa_mma{Dtype::kBf16, 1, 130, 4, 32}, gqa_simt{Dtype::kF32, 1, 130, 3, 24};
  gqa_mma.KVH = 2;
  gqa_simt.KVH = 1;
  for (const Case& c : {Case{Dtype::kBf16, 1, 130, 2, 32}, Case{Dtype::kBf16, 1, 97, 1, 128},
                        Case{Dtype::kF32, 1, 130, 1, 24},
                        Case{Dtype::kBf16, 1, 70, 1, 16, /*misaligned=*/true}, gqa_mma, gqa_simt}) {
    SCOPED_TRACE(name(c));
    if (c.dtype == Dtype::kBf16) {
      expect_same_bits_under_every_schedule<Bf16>(c);
    } else {
      expect_same_bits_under_every_schedule<float>(c);
    }
  }
}

std::string error_of(int C, int NH, int KVH) {
  std::vector<float> qkv(3 * C * 4), out(C * 4), lse(4 * NH);
  try {
    flash_attention_forward<float>(out.data(), lse.data(), qkv.data(), 1, 4, C, NH, KVH, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FlashAttentionEmulatedHost, BadSizesAreRejectedWithAHint) {
  EXPECT_NE(error_of(30, 4, 4).find("n_embd 30 is not a multiple of n_head 4"), std::string::npos)
      << error_of(30, 4, 4);
  const std::string too_wide = error_of(256, 1, 1);
  EXPECT_NE(too_wide.find("head sizes up to 128, got 256"), std::string::npos) << too_wide;
  EXPECT_NE(too_wide.find("use more heads"), std::string::npos) << too_wide;
  const std::string groups = error_of(32, 4, 3);
  EXPECT_NE(groups.find("n_head 4 is not a multiple of n_kv_head 3"), std::string::npos) << groups;
  EXPECT_NE(error_of(32, 4, 0).find("bad sizes"), std::string::npos) << error_of(32, 4, 0);
}

// The scratch holds every head's dS tiles up to the budget, then as many heads as fit.
TEST(FlashAttentionEmulatedHost, ScratchSizes) {
  // GPT-2 small, B = 16, T = 1024, bf16: delta [16, 12, 1024] fp32 and 192 heads of 136
  // tile pairs of 64 x 64 bf16, in one chunk.
  const size_t delta = 4 * 16 * 12 * 1024, head = 136 * 64 * 64 * 2;
  EXPECT_EQ(flash_attention_backward_scratch_bytes<Bf16>(16, 1024, 768, 12, 12),
            delta + 192 * head);
  EXPECT_EQ(flash_attention_backward_min_scratch_bytes<Bf16>(16, 1024, 768, 12, 12), delta + head);
  EXPECT_EQ(flash_attention_backward_scratch_bytes<float>(16, 1024, 768, 12, 12),
            delta + kFlashBackwardScratchBudget / (2 * head) * (2 * head));
  // Past the budget: as many heads as fit, at least one.
  EXPECT_LE(flash_attention_backward_scratch_bytes<Bf16>(64, 1024, 768, 12, 12),
            4 * 64 * 12 * 1024 + kFlashBackwardScratchBudget);
  const size_t long_head = size_t{256} * 257 / 2 * 64 * 64 * 4;  // T = 16384, fp32: 514 MiB
  EXPECT_EQ(flash_attention_backward_scratch_bytes<float>(2, 16384, 64, 1, 1),
            2 * 4 * 16384 + long_head);
  // delta is padded to 256 bytes, so the dS tiles stay 16-byte aligned.
  EXPECT_EQ(flash_attention_backward_min_scratch_bytes<Bf16>(1, 3, 8, 1, 1), 256 + 2 * 64 * 64);
  EXPECT_EQ(flash_attention_backward_scratch_bytes<Bf16>(0, 3, 8, 1, 1), 0u);
  // Grouped-query (Llama 3 8B's heads, T = 1024, bf16): delta is per query head, and the
  // scratch holds whole groups of 4 query heads' dS tiles: all 8 key/value heads at B = 1,
  // 60 of the 128 at B = 16 (the budget), at least one group.
  const size_t group = 4 * head, llama_delta = 4 * 32 * 1024;
  EXPECT_EQ(flash_attention_backward_scratch_bytes<Bf16>(1, 1024, 4096, 32, 8),
            llama_delta + 8 * group);
  EXPECT_EQ(flash_attention_backward_scratch_bytes<Bf16>(16, 1024, 4096, 32, 8),
            16 * llama_delta + kFlashBackwardScratchBudget / group * group);
  EXPECT_EQ(kFlashBackwardScratchBudget / group, 60u);
  EXPECT_EQ(flash_attention_backward_min_scratch_bytes<Bf16>(16, 1024, 4096, 32, 8),
            16 * llama_delta + group);
  EXPECT_EQ(flash_attention_backward_min_scratch_bytes<Bf16>(1, 3, 8, 4, 1), 256 + 4 * 2 * 64 * 64);
}

TEST(FlashAttentionEmulatedHost, TooLittleScratchIsRejected) {
  const int B = 1, T = 70, C = 32, NH = 2;
  std::vector<float> qkv(3 * C * T), dqkv(3 * C * T), out(C * T), dout(C * T), lse(NH * T);
  const size_t need = flash_attention_backward_min_scratch_bytes<float>(B, T, C, NH, NH);
  std::vector<uint64_t> scratch(need / 8);
  try {
    flash_attention_backward<float>(dqkv.data(), scratch.data(), need - 1, dout.data(), qkv.data(),
                                    out.data(), lse.data(), B, T, C, NH, NH, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of scratch, less than the"), std::string::npos)
        << e.what();
  }
}

TEST(FlashAttentionEmulatedHost, EmptyInputsLaunchNothing) {
  for (const auto& [B, T] : {std::pair{0, 5}, std::pair{2, 0}}) {
    std::vector<Bf16> out(1, from_float<Bf16>(1.0f));
    std::vector<float> lse(1, 1.0f);
    flash_attention_forward<Bf16>(out.data(), lse.data(), out.data(), B, T, 64, 1, 1, nullptr);
    EXPECT_EQ(to_float(out[0]), 1.0f) << "B=" << B << " T=" << T;
    EXPECT_EQ(lse[0], 1.0f) << "B=" << B << " T=" << T;
  }
}

// A query head reads its key/value head exactly as multi-head attention reads a copy of it:
// with every key/value head repeated for its group (KVH = NH), out, lse and dq are the same
// bits, and each grouped dk, dv is the sum of its query heads' (within rounding: the group's
// sum runs inside the kernel). A wrong group index fails the bits, not just a tolerance.
template <typename Elem>
void expect_grouped_heads_read_their_key_value_head(Case c) {
  SCOPED_TRACE(name(c));
  const int NH = c.NH, KVH = c.kv_heads(), group = NH / KVH, hs = c.hs;
  const size_t rows = static_cast<size_t>(c.B) * c.T, W = qkv_width(c);
  const Inputs<Elem> gqa_in = random_inputs<Elem>(c);
  Case mha = c;
  mha.KVH = NH;
  const size_t mha_W = qkv_width(mha);
  Inputs<Elem> mha_in{Tensor<Elem>(rows * mha_W, c.misaligned, Elem{}), gqa_in.dout};
  for (size_t t = 0; t < rows; t++) {
    for (int h = 0; h < NH; h++) {
      for (int d = 0; d < hs; d++) {
        const size_t g = h / group;
        mha_in.qkv[t * mha_W + h * hs + d] = gqa_in.qkv[t * W + h * hs + d];
        mha_in.qkv[t * mha_W + (NH + h) * hs + d] = gqa_in.qkv[t * W + (NH + g) * hs + d];
        mha_in.qkv[t * mha_W + (2 * NH + h) * hs + d] = gqa_in.qkv[t * W + (NH + KVH + g) * hs + d];
      }
    }
  }
  const Outputs<Elem> gqa = run_kernels<Elem>(c, gqa_in);
  const Outputs<Elem> repeated = run_kernels<Elem>(mha, mha_in);
  const auto bits = [](const auto& a, const auto& b, size_t i, size_t j) {
    return std::memcmp(a.data() + i, b.data() + j, sizeof(a[i])) == 0;
  };
  for (size_t i = 0; i < gqa.out.size(); i++)
    ASSERT_TRUE(bits(gqa.out, repeated.out, i, i)) << "out[" << i << "]";
  for (size_t i = 0; i < gqa.lse.size(); i++)
    ASSERT_TRUE(bits(gqa.lse, repeated.lse, i, i)) << "lse[" << i << "]";
  double scale = 0;
  for (size_t i = 0; i < repeated.dqkv.size(); i++)
    scale = std::max(scale, std::fabs(as_double(repeated.dqkv[i])));
  const double tol = (std::is_same_v<Elem, Bf16> ? 2e-2 : 1e-5) * scale;
  for (size_t t = 0; t < rows; t++) {
    for (int d = 0; d < hs; d++) {
      for (int h = 0; h < NH; h++)
        ASSERT_TRUE(bits(gqa.dqkv, repeated.dqkv, t * W + h * hs + d, t * mha_W + h * hs + d))
            << "dq row " << t << " head " << h << " column " << d;
      for (int g = 0; g < KVH; g++) {
        for (int part = 0; part < 2; part++) {  // dk, dv
          double sum = 0;
          for (int r = 0; r < group; r++)
            sum += as_double(repeated.dqkv[t * mha_W + ((1 + part) * NH + g * group + r) * hs + d]);
          ASSERT_NEAR(as_double(gqa.dqkv[t * W + (NH + part * KVH + g) * hs + d]), sum, tol)
              << (part == 0 ? "dk" : "dv") << " row " << t << " head " << g << " column " << d;
        }
      }
    }
  }
}

TEST(FlashAttentionEmulatedGroupedQuery, QueryHeadsReadTheirKeyValueHead) {
  Case c{Dtype::kBf16, 2, 70, 6, 16};  // tensor cores
  c.KVH = 3;
  expect_grouped_heads_read_their_key_value_head<Bf16>(c);
  c.dtype = Dtype::kF32;  // SIMT
  c.KVH = 2;
  expect_grouped_heads_read_their_key_value_head<float>(c);
}

// ---- The emulator itself: it reports what the tests above rely on it to report ----------

// The launch's error message, or "" if it succeeded.
std::string emulation_error(size_t shared_bytes, const std::function<void()>& kernel) {
  try {
    cuda_emulation::launch(dim3(2), dim3(128), shared_bytes, kernel);
  } catch (const cuda_emulation::EmulationError& e) {
    return e.what();
  }
  return "";
}

TEST(SimtEmulator, BarrierThatSomeThreadsSkipIsADeadlock) {
  const std::string error = emulation_error(0, [] {
    if (threadIdx.x < 64) __syncthreads();
  });
  EXPECT_NE(error.find("deadlock"), std::string::npos) << error;
  EXPECT_NE(error.find("64 of 128 threads wait at __syncthreads"), std::string::npos) << error;
  EXPECT_EQ(emulation_error(0, [] { __syncthreads(); }), "") << "usable after a fault";
}

TEST(SimtEmulator, LanesAtDifferentWarpOperationsFault) {
  const std::string error = emulation_error(0, [] {
    if (threadIdx.x % 2 == 0) {
      __syncwarp();
    } else {
      (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
    }
  });
  EXPECT_NE(error.find("divergent synchronization"), std::string::npos) << error;
}

TEST(SimtEmulator, WriteOutsideSharedMemoryIsReported) {
  const std::string error = emulation_error(64, [] {
    if (threadIdx.x == 5) cuda_emulation::shared_memory()[64 + 3] = 0;
  });
  EXPECT_NE(error.find("outside the block's 64 bytes of dynamic shared memory"), std::string::npos)
      << error;
}

TEST(SimtEmulator, SharedMemoryStartsAsNaN) {
  float first = 0.0f;
  EXPECT_EQ(emulation_error(16,
                            [&] {
                              if (threadIdx.x == 0) {
                                std::memcpy(&first, cuda_emulation::shared_memory(), 4);
                              }
                            }),
            "");
  EXPECT_TRUE(std::isnan(first));
}

TEST(SimtEmulator, ShuffleExchangesBetweenLanes) {
  std::vector<float> got(256, -1.0f);
  EXPECT_EQ(emulation_error(0,
                            [&] {
                              const unsigned i = blockIdx.x * 128 + threadIdx.x;
                              got[i] = __shfl_xor_sync(0xffffffffu, static_cast<float>(i), 5);
                            }),
            "");
  for (unsigned i = 0; i < 256; i++) EXPECT_EQ(got[i], static_cast<float>(i ^ 5)) << i;
}

// The schedules decide which thread runs first after a barrier.
TEST(SimtEmulator, SchedulesOrderTheThreads) {
  const auto order_after_barrier = [](Schedule schedule) {
    std::vector<unsigned> order;
    cuda_emulation::set_schedule(schedule, /*seed=*/7);
    cuda_emulation::launch(dim3(1), dim3(128), 0, [&] {
      __syncthreads();
      order.push_back(threadIdx.x);
    });
    cuda_emulation::set_schedule(Schedule::kRoundRobin);
    return order;
  };
  const std::vector<unsigned> lowest = order_after_barrier(Schedule::kLowestFirst);
  const std::vector<unsigned> highest = order_after_barrier(Schedule::kHighestFirst);
  const std::vector<unsigned> random = order_after_barrier(Schedule::kRandom);
  ASSERT_EQ(lowest.size(), 128u);
  EXPECT_TRUE(std::is_sorted(lowest.begin(), lowest.end()));
  EXPECT_TRUE(std::is_sorted(highest.rbegin(), highest.rend()));
  EXPECT_FALSE(std::is_sorted(random.begin(), random.end()));
  EXPECT_FALSE(std::is_sorted(random.rbegin(), random.rend()));
  EXPECT_TRUE(std::is_permutation(random.begin(), random.end(), lowest.begin()));
}

}  // namespace
}  // namespace tandem::cuda
