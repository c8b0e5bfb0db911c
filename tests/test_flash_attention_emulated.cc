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
// 32-row backward steps), T of 1, below, at and past tile boundaries, and several batches
// and heads. Races show up as results that differ between thread schedules.
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
  // room for n heads' dS tiles, so it runs in chunks of heads.
  int scratch_heads = 0;
};

std::string name(const Case& c) {
  std::string s = std::string(c.dtype == Dtype::kBf16 ? "bf16" : "f32") + "_B" +
                  std::to_string(c.B) + "_T" + std::to_string(c.T) + "_NH" + std::to_string(c.NH) +
                  "_hs" + std::to_string(c.hs);
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

// Random q, k, v (a wide spread, for peaked softmax rows) and dout for case c.
template <typename Elem>
Inputs<Elem> random_inputs(const Case& c) {
  const size_t C = static_cast<size_t>(c.NH) * c.hs, rows = static_cast<size_t>(c.B) * c.T;
  Inputs<Elem> in{Tensor<Elem>(rows * 3 * C, c.misaligned, Elem{}),
                  Tensor<Elem>(rows * C, c.misaligned, Elem{})};
  std::mt19937 rng(static_cast<unsigned>(1000003 * c.B + 1009 * c.T + 101 * c.NH + c.hs));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < in.qkv.size(); i++) in.qkv[i] = from_float<Elem>(1.5f * normal(rng));
  for (size_t i = 0; i < in.dout.size(); i++) in.dout[i] = from_float<Elem>(normal(rng));
  return in;
}

// One head's dS tiles in the backward scratch: a 64 x 64 tile per (query tile, key tile <=
// query tile).
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
  cuda_emulation::set_schedule(c.schedule, /*seed=*/12345);
  flash_attention_forward<Elem>(o.out.data(), o.lse.data(), in.qkv.data(), c.B, c.T, C, c.NH,
                                nullptr);
  // NaN bytes, so that a dS element the dk/dv pass leaves unwritten fails the comparisons.
  const size_t scratch_bytes =
      c.scratch_heads == 0 ? flash_attention_backward_scratch_bytes<Elem>(c.B, c.T, C, c.NH)
                           : flash_attention_backward_min_scratch_bytes<Elem>(c.B, c.T, C, c.NH) +
                                 (c.scratch_heads - 1) * head_ds_bytes<Elem>(c.T);
  std::vector<uint64_t> scratch((scratch_bytes + 7) / 8, ~uint64_t{0});  // 8-byte aligned
  flash_attention_backward<Elem>(o.dqkv.data(), scratch.data(), scratch_bytes, in.dout.data(),
                                 in.qkv.data(), o.out.data(), o.lse.data(), c.B, c.T, C, c.NH,
                                 nullptr);
  cuda_emulation::set_schedule(Schedule::kRoundRobin);
  return o;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Naive causal attention in double precision. The backward pass uses the kernels' own
// forward output in D = dout . out, as flash_attention_backward does.
Reference reference(const std::vector<double>& qkv, const std::vector<double>& dout,
                    const std::vector<double>& out_used, const Case& c) {
  const int B = c.B, T = c.T, NH = c.NH, hs = c.hs, C = NH * hs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Reference r;
  const size_t n = static_cast<size_t>(B) * T * C;
  r.out.assign(n, 0);
  r.dq.assign(n, 0);
  r.dk.assign(n, 0);
  r.dv.assign(n, 0);
  r.lse.assign(static_cast<size_t>(B) * NH * T, 0);
  const auto x = [&](int part, int b, int t, int h, int d) {  // part 0, 1, 2: q, k, v
    return qkv[(static_cast<size_t>(b) * T + t) * 3 * C + part * C + h * hs + d];
  };
  const auto row = [&](int b, int t, int h) {
    return (static_cast<size_t>(b) * T + t) * C + h * hs;
  };
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      std::vector<std::vector<double>> P(T, std::vector<double>(T, 0.0));
      for (int t = 0; t < T; t++) {
        std::vector<double> s(t + 1);
        double m = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          double dot = 0;
          for (int d = 0; d < hs; d++) dot += x(0, b, t, h, d) * x(1, b, t2, h, d);
          s[t2] = dot * scale;
          m = std::max(m, s[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; t2++) sum += std::exp(s[t2] - m);
        for (int t2 = 0; t2 <= t; t2++) P[t][t2] = std::exp(s[t2] - m) / sum;
        r.lse[(static_cast<size_t>(b) * NH + h) * T + t] = m + std::log(sum);
        for (int d = 0; d < hs; d++) {
          double o = 0;
          for (int t2 = 0; t2 <= t; t2++) o += P[t][t2] * x(2, b, t2, h, d);
          r.out[row(b, t, h) + d] = o;
        }
      }
      for (int t = 0; t < T; t++) {
        const size_t o = row(b, t, h);
        double D = 0;
        for (int d = 0; d < hs; d++) D += dout[o + d] * out_used[o + d];
        for (int t2 = 0; t2 <= t; t2++) {
          double dp = 0;
          for (int d = 0; d < hs; d++) dp += dout[o + d] * x(2, b, t2, h, d);
          const double ds = P[t][t2] * (dp - D) * scale;
          for (int d = 0; d < hs; d++) {
            r.dq[row(b, t, h) + d] += ds * x(1, b, t2, h, d);
            r.dk[row(b, t2, h) + d] += ds * x(0, b, t, h, d);
            r.dv[row(b, t2, h) + d] += P[t][t2] * dout[o + d];
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
  const auto doubles = [](const auto& tensor, size_t begin, size_t count, size_t stride,
                          size_t width) {  // `count` rows of `width` at `begin` + i * stride
    std::vector<double> v;
    for (size_t i = 0; i < count; i++) {
      for (size_t j = 0; j < width; j++) v.push_back(as_double(tensor[begin + i * stride + j]));
    }
    return v;
  };
  const Reference r = reference(doubles(in.qkv, 0, rows, 3 * C, 3 * C),
                                doubles(in.dout, 0, rows, C, C), doubles(o.out, 0, rows, C, C), c);
  const bool bf16 = std::is_same_v<Elem, Bf16>;
  EXPECT_TRUE(close("out", doubles(o.out, 0, rows, C, C), r.out, bf16 ? 2e-2 : 2e-5));
  EXPECT_TRUE(close("lse", doubles(o.lse, 0, o.lse.size(), 1, 1), r.lse, bf16 ? 1e-4 : 2e-6));
  // dq, dk and dv separately: their scales differ.
  const double grad_tol = bf16 ? 3e-2 : 5e-5;
  EXPECT_TRUE(close("dq", doubles(o.dqkv, 0, rows, 3 * C, C), r.dq, grad_tol));
  EXPECT_TRUE(close("dk", doubles(o.dqkv, C, rows, 3 * C, C), r.dk, grad_tol));
  EXPECT_TRUE(close("dv", doubles(o.dqkv, 2 * C, rows, 3 * C, C), r.dv, grad_tol));
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
}

TEST(FlashAttentionEmulatedDeterminism, SameBitsUnderEverySchedule) {
  for (const Case& c :
       {Case{Dtype::kBf16, 1, 130, 2, 32}, Case{Dtype::kBf16, 1, 97, 1, 128},
        Case{Dtype::kF32, 1, 130, 1, 24}, Case{Dtype::kBf16, 1, 70, 1, 16, /*misaligned=*/true}}) {
    SCOPED_TRACE(name(c));
    if (c.dtype == Dtype::kBf16) {
      expect_same_bits_under_every_schedule<Bf16>(c);
    } else {
      expect_same_bits_under_every_schedule<float>(c);
    }
  }
}

std::string error_of(int C, int NH) {
  std::vector<float> qkv(3 * C * 4), out(C * 4), lse(4 * NH);
  try {
    flash_attention_forward<float>(out.data(), lse.data(), qkv.data(), 1, 4, C, NH, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FlashAttentionEmulatedHost, BadSizesAreRejectedWithAHint) {
  EXPECT_NE(error_of(30, 4).find("n_embd 30 is not a multiple of n_head 4"), std::string::npos)
      << error_of(30, 4);
  const std::string too_wide = error_of(256, 1);
  EXPECT_NE(too_wide.find("head sizes up to 128, got 256"), std::string::npos) << too_wide;
  EXPECT_NE(too_wide.find("use more heads"), std::string::npos) << too_wide;
}

// The scratch holds every head's dS tiles up to the budget, then as many heads as fit.
TEST(FlashAttentionEmulatedHost, ScratchSizes) {
  // GPT-2 small, B = 16, T = 1024, bf16: delta [16, 12, 1024] fp32 and 192 heads of 136
  // tile pairs of 64 x 64 bf16, in one chunk.
  const size_t delta = 4 * 16 * 12 * 1024, head = 136 * 64 * 64 * 2;
  EXPECT_EQ(flash_attention_backward_scratch_bytes<Bf16>(16, 1024, 768, 12), delta + 192 * head);
  EXPECT_EQ(flash_attention_backward_min_scratch_bytes<Bf16>(16, 1024, 768, 12), delta + head);
  EXPECT_EQ(flash_attention_backward_scratch_bytes<float>(16, 1024, 768, 12),
            delta + kFlashBackwardScratchBudget / (2 * head) * (2 * head));
  // Past the budget: as many heads as fit, at least one.
  EXPECT_LE(flash_attention_backward_scratch_bytes<Bf16>(64, 1024, 768, 12),
            4 * 64 * 12 * 1024 + kFlashBackwardScratchBudget);
  const size_t long_head = size_t{256} * 257 / 2 * 64 * 64 * 4;  // T = 16384, fp32: 514 MiB
  EXPECT_EQ(flash_attention_backward_scratch_bytes<float>(2, 16384, 64, 1),
            2 * 4 * 16384 + long_head);
  // delta is padded to 256 bytes, so the dS tiles stay 16-byte aligned.
  EXPECT_EQ(flash_attention_backward_min_scratch_bytes<Bf16>(1, 3, 8, 1), 256 + 2 * 64 * 64);
  EXPECT_EQ(flash_attention_backward_scratch_bytes<Bf16>(0, 3, 8, 1), 0u);
}

TEST(FlashAttentionEmulatedHost, TooLittleScratchIsRejected) {
  const int B = 1, T = 70, C = 32, NH = 2;
  std::vector<float> qkv(3 * C * T), dqkv(3 * C * T), out(C * T), dout(C * T), lse(NH * T);
  const size_t need = flash_attention_backward_min_scratch_bytes<float>(B, T, C, NH);
  std::vector<uint64_t> scratch(need / 8);
  try {
    flash_attention_backward<float>(dqkv.data(), scratch.data(), need - 1, dout.data(), qkv.data(),
                                    out.data(), lse.data(), B, T, C, NH, nullptr);
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
    flash_attention_forward<Bf16>(out.data(), lse.data(), out.data(), B, T, 64, 1, nullptr);
    EXPECT_EQ(to_float(out[0]), 1.0f) << "B=" << B << " T=" << T;
    EXPECT_EQ(lse[0], 1.0f) << "B=" << B << " T=" << T;
  }
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
