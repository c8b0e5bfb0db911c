// The CUDA kernels of kernels.cu (embedding, LayerNorm, RMSNorm, RoPE, SwiGLU, elementwise,
// cross-entropy and reductions) run on the CPU by the SIMT emulator (see cuda_emulation/README.md),
// against the CPU backend's kernels: tandem::cpu's, for fp32 storage and overloaded for Bf16
// (which widen to fp32 and round each stored result once, as the CUDA kernels do). The
// sizes, cases and tolerances are those of expect_every_kernel_matches in
// test_cuda_backend.cc, which runs the same comparison on a GPU where there is one.
//
// Emulated "device memory" is host memory: the kernels' arguments are ordinary pointers.
// Every output that a kernel overwrites starts as NaN, and every scratch buffer as NaN
// bytes followed by guard bytes, so an element no thread writes, a scratch value read
// before it is written, or a write past the scratch size the kernels ask for all fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cuda_emulation/simt_emulator.h"
#include "support/test_util.h"
#include "tandem/compute/cpu/bf16_kernels.h"
#include "tandem/compute/cpu/cpu_kernels.h"
#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/core/half.h"
#include "tandem/core/rng.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/grad_clip.h"

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

using cuda_emulation::Schedule;

// An array 64-byte aligned, so that `data() + k` is misaligned for 16-byte loads exactly
// when k elements are not a multiple of 16 bytes.
template <typename T>
class Array {
 public:
  explicit Array(std::vector<T> values)
      : n_(values.size()),
        p_(static_cast<T*>(::operator new(std::max<size_t>(n_, 1) * sizeof(T), kAlign))) {
    std::copy(values.begin(), values.end(), p_.get());
  }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  size_t size() const { return n_; }
  std::vector<T> values() const { return std::vector<T>(p_.get(), p_.get() + n_); }

 private:
  static constexpr std::align_val_t kAlign{64};
  struct Free {
    void operator()(T* p) const { ::operator delete(p, kAlign); }
  };
  size_t n_;
  std::unique_ptr<T, Free> p_;
};

// Scratch memory for the kernels that take it: NaN bytes, then guard bytes that must
// survive the launch.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes), storage_((bytes + kGuard + 15) / 16 + 1) {
    std::memset(begin(), 0xff, bytes_);
    std::memset(begin() + bytes_, kGuardByte, kGuard);
  }
  void* get() { return begin(); }
  bool intact() const {
    const auto* guard = reinterpret_cast<const unsigned char*>(storage_.data()) + bytes_;
    return std::all_of(guard, guard + kGuard, [](unsigned char c) { return c == kGuardByte; });
  }

 private:
  static constexpr size_t kGuard = 256;
  static constexpr unsigned char kGuardByte = 0xa5;
  struct alignas(16) Chunk {
    unsigned char bytes[16];
  };
  unsigned char* begin() { return reinterpret_cast<unsigned char*>(storage_.data()); }
  size_t bytes_;
  std::vector<Chunk> storage_;
};

// The CPU reference for column_sums_accumulate, which the CPU backend has for fp32 only:
// for Bf16 the fp32 kernel on the widened values, rounded once, which is the contract
// (sums in fp32, the old value added before rounding).
void column_sums_reference(float* sum, const float* x, int N, int C) {
  cpu::column_sums_accumulate(kernel_pool(), sum, x, N, C);
}
void column_sums_reference(Bf16* sum, const Bf16* x, int N, int C) {
  std::vector<float> s(C), wide(static_cast<size_t>(N) * C);
  for (int c = 0; c < C; c++) s[c] = to_float(sum[c]);
  for (size_t i = 0; i < wide.size(); i++) wide[i] = to_float(x[i]);
  cpu::column_sums_accumulate(kernel_pool(), s.data(), wide.data(), N, C);
  for (int c = 0; c < C; c++) sum[c] = from_float<Bf16>(s[c]);
}

struct Sizes {
  int B, T, C, V;
  int NH, KVH;  // RoPE's query and key/value heads, of head size C / NH
};

// `values` after `offset` NaN elements: data() + offset of its Array is `offset` elements
// past a 64-byte boundary.
template <typename Elem>
std::vector<Elem> shifted(const std::vector<Elem>& values, size_t offset) {
  std::vector<Elem> v = nans<Elem>(offset);
  v.insert(v.end(), values.begin(), values.end());
  return v;
}

// A rotary table [T, HS/2, 2] as the model computes it (rope_cos_sin): angle t theta^(-2i/HS),
// with theta = 100 so that the angles turn far over a few positions.
std::vector<float> rope_table(int T, int HS) {
  std::vector<float> table;
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < HS / 2; i++) {
      const double angle = t * std::pow(100.0, -2.0 * i / HS);
      table.push_back(static_cast<float>(std::cos(angle)));
      table.push_back(static_cast<float>(std::sin(angle)));
    }
  }
  return table;
}

// The emulated results, in order, to compare between schedules bit for bit.
// encoder_backward on the CPU (onto dwte and dwpe, in place) and on the emulated GPU (onto
// copies of them) from the same inputs; returns the GPU's dwte and dwpe.
template <typename Elem>
std::pair<std::vector<Elem>, std::vector<Elem>> encoder_backward_on_both(
    std::vector<Elem>& dwte, std::vector<Elem>& dwpe, const std::vector<Elem>& dout,
    const std::vector<int32_t>& tokens, int B, int T, int C) {
  Array<Elem> got_dwte(dwte), got_dwpe(dwpe), d(dout);
  Array<int32_t> tok(tokens);
  cpu::encoder_backward(kernel_pool(), dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T,
                        C);
  Scratch scratch(cuda::encoder_backward_scratch_bytes(B, T, C));
  cuda::encoder_backward(got_dwte.data(), got_dwpe.data(), d.data(), tok.data(), B, T, C,
                         scratch.get(), nullptr);
  EXPECT_TRUE(scratch.intact()) << "encoder_backward wrote past its scratch";
  return {got_dwte.values(), got_dwpe.values()};
}

using Results = std::vector<std::pair<std::string, std::vector<unsigned char>>>;

template <typename T>
void keep(Results& results, const std::string& what, const T* p, size_t n) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  results.emplace_back(what, std::vector<unsigned char>(bytes, bytes + n * sizeof(T)));
}

// Expects got within rel * max|want| + 1e-6 of want, element by element (as fp32).
template <typename T>
void expect_near(const T* want, const T* got, size_t n, double rel, const std::string& what) {
  double scale = 0;
  for (size_t i = 0; i < n; i++) {
    scale = std::max(scale, std::fabs(static_cast<double>(to_float(want[i]))));
  }
  for (size_t i = 0; i < n; i++) {
    ASSERT_NEAR(to_float(want[i]), to_float(got[i]), rel * scale + 1e-6) << what << "[" << i << "]";
  }
}

// Runs every kernel of kernels.cu, emulated, and its CPU counterpart on the same inputs;
// returns the emulated results.
template <typename Elem>
Results expect_every_kernel_matches(const Sizes& s, double rel) {
  SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " C " << s.C << " V " << s.V
                                    << (sizeof(Elem) == 2 ? " bf16" : " fp32"));
  Results results;
  const int B = s.B, T = s.T, C = s.C, V = s.V, N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  const auto data = [](size_t n, uint64_t seed, float scale = 1.0f) {
    return stored<Elem>(randn(n, seed, scale));
  };
  Rng rng(1);
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; i++) {
    tokens[i] = static_cast<int32_t>(rng.next_u64() % V);
    targets[i] = static_cast<int32_t>(rng.next_u64() % V);
  }
  tokens[N - 1] = tokens[N - 2] = tokens[0];  // a token at three positions
  const std::vector<Elem> wte = data(static_cast<size_t>(V) * C, 2), wpe = data(T * C, 3);
  const std::vector<Elem> x = data(NC, 4), dout = data(NC, 5);

  {  // encoder_forward
    std::vector<Elem> want(NC);
    cpu::encoder_forward(kernel_pool(), want.data(), tokens.data(), wte.data(), wpe.data(), B, T,
                         C);
    Array<Elem> got(nans<Elem>(NC)), w(wte), p(wpe);
    Array<int32_t> tok(tokens);
    cuda::encoder_forward(got.data(), tok.data(), w.data(), p.data(), B, T, C, nullptr);
    expect_near(want.data(), got.data(), NC, rel, "encoder_forward");
    keep(results, "encoder_forward", got.data(), NC);
  }
  {  // encoder_backward: onto non-zero gradients; the repeated token's row adds three rows
    std::vector<Elem> dwte = data(static_cast<size_t>(V) * C, 20, 0.1f),
                      dwpe = data(T * C, 21, 0.1f);
    const auto [got_dwte, got_dwpe] = encoder_backward_on_both(dwte, dwpe, dout, tokens, B, T, C);
    expect_near(dwte.data(), got_dwte.data(), dwte.size(), rel, "encoder_backward dwte");
    expect_near(dwpe.data(), got_dwpe.data(), dwpe.size(), rel, "encoder_backward dwpe");
    keep(results, "encoder_backward dwte", got_dwte.data(), dwte.size());
    keep(results, "encoder_backward dwpe", got_dwpe.data(), dwpe.size());
  }
  {  // without a position embedding (Llama): wpe and dwpe null
    std::vector<Elem> want(NC);
    cpu::encoder_forward(kernel_pool(), want.data(), tokens.data(), wte.data(), nullptr, B, T, C);
    Array<Elem> got(nans<Elem>(NC)), w(wte);
    Array<int32_t> tok(tokens);
    cuda::encoder_forward(got.data(), tok.data(), w.data(), static_cast<const Elem*>(nullptr), B, T,
                          C, nullptr);
    expect_near(want.data(), got.data(), NC, 0, "encoder_forward without wpe");  // copies
    keep(results, "encoder_forward without wpe", got.data(), NC);

    std::vector<Elem> dwte = data(static_cast<size_t>(V) * C, 20, 0.1f);
    Array<Elem> got_dwte(dwte), d(dout);
    cpu::encoder_backward(kernel_pool(), dwte.data(), nullptr, dout.data(), tokens.data(), B, T, C);
    Scratch scratch(cuda::encoder_backward_scratch_bytes(B, T, C));
    cuda::encoder_backward(got_dwte.data(), static_cast<Elem*>(nullptr), d.data(), tok.data(), B, T,
                           C, scratch.get(), nullptr);
    expect_near(dwte.data(), got_dwte.data(), dwte.size(), rel, "encoder_backward without dwpe");
    EXPECT_TRUE(scratch.intact()) << "encoder_backward wrote past its scratch";
    keep(results, "encoder_backward without dwpe", got_dwte.data(), dwte.size());
  }

  // LayerNorm: the forward pass's mean and rstd (the CPU's) feed both backward passes.
  const std::vector<Elem> weight = data(C, 6, 0.5f), bias = data(C, 7, 0.5f);
  std::vector<float> mean(N), rstd(N);
  {
    std::vector<Elem> want(NC);
    cpu::layernorm_forward(kernel_pool(), want.data(), mean.data(), rstd.data(), x.data(),
                           weight.data(), bias.data(), N, C);
    Array<Elem> got(nans<Elem>(NC)), in(x), w(weight), b(bias);
    Array<float> got_mean(std::vector<float>(N, NAN)), got_rstd(std::vector<float>(N, NAN));
    cuda::layernorm_forward(got.data(), got_mean.data(), got_rstd.data(), in.data(), w.data(),
                            b.data(), N, C, nullptr);
    expect_near(want.data(), got.data(), NC, rel, "layernorm_forward");
    expect_near(mean.data(), got_mean.data(), N, rel, "layernorm_forward mean");
    expect_near(rstd.data(), got_rstd.data(), N, rel, "layernorm_forward rstd");
    keep(results, "layernorm_forward", got.data(), NC);
    keep(results, "layernorm_forward mean", got_mean.data(), N);
    keep(results, "layernorm_forward rstd", got_rstd.data(), N);
  }
  {
    std::vector<Elem> dx = data(NC, 22), dw = data(C, 23, 0.1f), db = data(C, 24, 0.1f);
    Array<Elem> got_dx(dx), got_dw(dw), got_db(db), d(dout), in(x), w(weight);
    Array<float> m(mean), r(rstd);
    cpu::layernorm_backward(kernel_pool(), dx.data(), dw.data(), db.data(), dout.data(), x.data(),
                            weight.data(), mean.data(), rstd.data(), N, C);
    Scratch scratch(cuda::layernorm_backward_scratch_bytes(N, C));
    cuda::layernorm_backward(got_dx.data(), got_dw.data(), got_db.data(), d.data(), in.data(),
                             w.data(), m.data(), r.data(), N, C, scratch.get(), nullptr);
    expect_near(dx.data(), got_dx.data(), NC, rel, "layernorm_backward dinp");
    expect_near(dw.data(), got_dw.data(), C, rel, "layernorm_backward dweight");
    expect_near(db.data(), got_db.data(), C, rel, "layernorm_backward dbias");
    EXPECT_TRUE(scratch.intact()) << "layernorm_backward wrote past its scratch";
    keep(results, "layernorm_backward dinp", got_dx.data(), NC);
    keep(results, "layernorm_backward dweight", got_dw.data(), C);
    keep(results, "layernorm_backward dbias", got_db.data(), C);
  }
  // RMSNorm on rows of mean square 9 (rstd 1/3, so that a missing or extra rstd factor
  // shows); the forward pass's rstd (the CPU's) feeds both backward passes.
  const std::vector<Elem> rms_x = data(NC, 19, 3.0f);
  const float eps = 1e-5f;
  std::vector<float> rms_rstd(N);
  {
    std::vector<Elem> want(NC);
    cpu::rmsnorm_forward(kernel_pool(), want.data(), rms_rstd.data(), rms_x.data(), weight.data(),
                         eps, N, C);
    Array<Elem> got(nans<Elem>(NC)), in(rms_x), w(weight);
    Array<float> got_rstd(std::vector<float>(N, NAN));
    cuda::rmsnorm_forward(got.data(), got_rstd.data(), in.data(), w.data(), eps, N, C, nullptr);
    expect_near(want.data(), got.data(), NC, rel, "rmsnorm_forward");
    expect_near(rms_rstd.data(), got_rstd.data(), N, rel, "rmsnorm_forward rstd");
    keep(results, "rmsnorm_forward", got.data(), NC);
    keep(results, "rmsnorm_forward rstd", got_rstd.data(), N);
  }
  {
    std::vector<Elem> dx = data(NC, 26), dw = data(C, 27, 0.1f);
    Array<Elem> got_dx(dx), got_dw(dw), d(dout), in(rms_x), w(weight);
    Array<float> r(rms_rstd);
    cpu::rmsnorm_backward(kernel_pool(), dx.data(), dw.data(), dout.data(), rms_x.data(),
                          weight.data(), rms_rstd.data(), N, C);
    Scratch scratch(cuda::rmsnorm_backward_scratch_bytes(N, C));
    cuda::rmsnorm_backward(got_dx.data(), got_dw.data(), d.data(), in.data(), w.data(), r.data(), N,
                           C, scratch.get(), nullptr);
    expect_near(dx.data(), got_dx.data(), NC, rel, "rmsnorm_backward dinp");
    expect_near(dw.data(), got_dw.data(), C, rel, "rmsnorm_backward dweight");
    EXPECT_TRUE(scratch.intact()) << "rmsnorm_backward wrote past its scratch";
    keep(results, "rmsnorm_backward dinp", got_dx.data(), NC);
    keep(results, "rmsnorm_backward dweight", got_dw.data(), C);
  }
  // Head RMSNorm (Qwen3's q/k norms): H = 2 heads of HS = C / 2 columns in rows of C + 3
  // (odd: the scalar path) or C + kPack (the vector path where C / 2 allows), the columns
  // outside the heads NaN on the way in and left so; its backward in place.
  for (const int pad : {3, 8}) {
    const int H = 2, HS = C / 2, stride = C + pad;
    const size_t span = static_cast<size_t>(N) * stride;
    const std::vector<Elem> hx = data(span, 33, 3.0f), hd = data(span, 34), hw = data(HS, 35, 0.5f);
    std::vector<Elem> want = nans<Elem>(span);
    std::vector<float> head_rstd(static_cast<size_t>(N) * H);
    cpu::head_rmsnorm_forward(kernel_pool(), want.data(), head_rstd.data(), hx.data(), hw.data(),
                              eps, N, H, HS, stride);
    Array<Elem> got(nans<Elem>(span)), in(hx), w(hw);
    Array<float> got_rstd(std::vector<float>(head_rstd.size(), NAN));
    cuda::head_rmsnorm_forward(got.data(), got_rstd.data(), in.data(), w.data(), eps, N, H, HS,
                               stride, nullptr);
    size_t written_outside = 0;
    for (size_t i = 0; i < span; i++)
      if (std::isnan(to_float(want[i])) && !std::isnan(to_float(got.data()[i]))) written_outside++;
    EXPECT_EQ(written_outside, 0u) << "head_rmsnorm_forward wrote outside the heads";
    std::vector<Elem> want_heads, got_heads;
    for (size_t i = 0; i < span; i++)
      if (!std::isnan(to_float(want[i]))) {
        want_heads.push_back(want[i]);
        got_heads.push_back(got.data()[i]);
      }
    EXPECT_EQ(want_heads.size(), static_cast<size_t>(N) * H * HS);
    expect_near(want_heads.data(), got_heads.data(), want_heads.size(), rel,
                "head_rmsnorm_forward");
    expect_near(head_rstd.data(), got_rstd.data(), head_rstd.size(), rel,
                "head_rmsnorm_forward rstd");
    std::vector<Elem> dx = hd, dw = data(HS, 36, 0.1f);
    Array<Elem> got_dx(hd), got_dw(dw);
    Array<float> r(head_rstd);
    cpu::head_rmsnorm_backward(kernel_pool(), dx.data(), dw.data(), dx.data(), hx.data(), hw.data(),
                               head_rstd.data(), N, H, HS, stride);
    Scratch scratch(cuda::head_rmsnorm_backward_scratch_bytes(N, H, HS));
    cuda::head_rmsnorm_backward(got_dx.data(), got_dw.data(), got_dx.data(), in.data(), w.data(),
                                r.data(), N, H, HS, stride, scratch.get(), nullptr);
    expect_near(dx.data(), got_dx.data(), span, rel, "head_rmsnorm_backward dinp (in place)");
    expect_near(dw.data(), got_dw.data(), HS, rel, "head_rmsnorm_backward dweight");
    EXPECT_TRUE(scratch.intact()) << "head_rmsnorm_backward wrote past its scratch";
  }

  // RoPE in place on qkv [N, (NH + 2 KVH) HS] and SwiGLU on [N, 2I] with I = C: aligned
  // (16-byte packs when HS/2 and I allow) and one element in (the scalar path).
  for (const size_t offset : {size_t{0}, size_t{1}}) {
    const std::string at = offset == 0 ? "" : ", unaligned";
    const int NH = s.NH, KVH = s.KVH, HS = C / NH, I = C;
    const size_t qkv_n = static_cast<size_t>(N) * (NH + 2 * KVH) * HS;
    Array<float> cos_sin(rope_table(T, HS));
    for (const bool forward : {true, false}) {
      const std::string what = (forward ? "rope_forward" : "rope_backward") + at;
      std::vector<Elem> want = data(qkv_n, forward ? 16 : 17);
      Array<Elem> got(shifted(want, offset));
      if (forward) {
        cpu::rope_forward(kernel_pool(), want.data(), cos_sin.data(), B, T, NH, KVH, HS);
        cuda::rope_forward(got.data() + offset, cos_sin.data(), B, T, NH, KVH, HS, nullptr);
      } else {
        cpu::rope_backward(kernel_pool(), want.data(), cos_sin.data(), B, T, NH, KVH, HS);
        cuda::rope_backward(got.data() + offset, cos_sin.data(), B, T, NH, KVH, HS, nullptr);
      }
      expect_near(want.data(), got.data() + offset, qkv_n, rel, what);
      keep(results, what, got.data() + offset, qkv_n);
    }

    const std::vector<Elem> gate_up = data(static_cast<size_t>(N) * 2 * I, 18, 2.0f);
    Array<Elem> in(shifted(gate_up, offset)), d(shifted(dout, offset));
    std::vector<Elem> want(NC), dwant(2 * NC);
    cpu::swiglu_forward(kernel_pool(), want.data(), gate_up.data(), N, I);
    Array<Elem> got(nans<Elem>(NC + offset));
    cuda::swiglu_forward(got.data() + offset, in.data() + offset, N, I, nullptr);
    expect_near(want.data(), got.data() + offset, NC, rel, "swiglu_forward" + at);
    keep(results, "swiglu_forward" + at, got.data() + offset, NC);
    cpu::swiglu_backward(kernel_pool(), dwant.data(), gate_up.data(), dout.data(), N, I);
    Array<Elem> dgot(nans<Elem>(2 * NC + offset));
    cuda::swiglu_backward(dgot.data() + offset, in.data() + offset, d.data() + offset, N, I,
                          nullptr);
    expect_near(dwant.data(), dgot.data() + offset, 2 * NC, rel, "swiglu_backward" + at);
    keep(results, "swiglu_backward" + at, dgot.data() + offset, 2 * NC);
  }

  // column_sums_accumulate onto a non-zero sum, aligned and one element in (scalar path).
  for (const size_t offset : {size_t{0}, size_t{1}}) {
    const int rows = N - static_cast<int>(offset);  // x + offset still has `rows` rows
    const std::string what = "column_sums_accumulate, offset " + std::to_string(offset);
    std::vector<Elem> sum = data(C, 25, 0.1f);
    Array<Elem> got(sum), in(x);
    column_sums_reference(sum.data(), x.data() + offset, rows, C);
    Scratch scratch(cuda::column_sums_scratch_bytes(rows, C));
    cuda::column_sums_accumulate(got.data(), in.data() + offset, rows, C, scratch.get(), nullptr);
    expect_near(sum.data(), got.data(), C, rel, what);
    EXPECT_TRUE(scratch.intact()) << what << " wrote past its scratch";
    keep(results, what, got.data(), C);
  }

  // Elementwise, aligned and one element in.
  for (const size_t offset : {size_t{0}, size_t{1}}) {
    const size_t n = NC - offset;
    const std::string at = offset == 0 ? "" : ", unaligned";
    Array<Elem> in(x), d(dout);
    std::vector<Elem> want(NC);
    Array<Elem> got(nans<Elem>(NC));
    cpu::gelu_forward(kernel_pool(), want.data() + offset, x.data() + offset, n);
    cuda::gelu_forward(got.data() + offset, in.data() + offset, n, nullptr);
    expect_near(want.data() + offset, got.data() + offset, n, rel, "gelu_forward" + at);
    keep(results, "gelu_forward" + at, got.data() + offset, n);

    Array<Elem> got2(nans<Elem>(NC));
    cpu::gelu_backward(kernel_pool(), want.data() + offset, x.data() + offset, dout.data() + offset,
                       n);
    cuda::gelu_backward(got2.data() + offset, in.data() + offset, d.data() + offset, n, nullptr);
    expect_near(want.data() + offset, got2.data() + offset, n, rel, "gelu_backward" + at);
    keep(results, "gelu_backward" + at, got2.data() + offset, n);

    Array<Elem> got3(nans<Elem>(NC));
    cpu::residual_forward(kernel_pool(), want.data() + offset, x.data() + offset,
                          dout.data() + offset, n);
    cuda::residual_forward(got3.data() + offset, in.data() + offset, d.data() + offset, n, nullptr);
    expect_near(want.data() + offset, got3.data() + offset, n, 0, "residual_forward" + at);
    keep(results, "residual_forward" + at, got3.data() + offset, n);
  }

  {  // cross-entropy: rows of V elements start at every offset from a 16-byte boundary
    const size_t NV = static_cast<size_t>(N) * V;
    const std::vector<Elem> logits = data(NV, 12, 3.0f);
    Array<Elem> lg(logits);
    Array<int32_t> tgt(targets);
    std::vector<float> losses(N);
    cpu::cross_entropy_forward(kernel_pool(), losses.data(), logits.data(), targets.data(), N, V);
    Array<float> got_losses(std::vector<float>(N, NAN));
    cuda::cross_entropy_forward(got_losses.data(), lg.data(), tgt.data(), N, V, nullptr);
    expect_near(losses.data(), got_losses.data(), N, rel, "cross_entropy_forward");
    keep(results, "cross_entropy_forward", got_losses.data(), N);

    std::vector<Elem> dlogits(NV);
    cpu::cross_entropy_backward(kernel_pool(), dlogits.data(), logits.data(), targets.data(), 0.25f,
                                N, V);
    // dlogits at logits' offset from 16 bytes (vector path) and one element off (scalar).
    for (const size_t offset : {size_t{0}, size_t{1}}) {
      const std::string what = "cross_entropy_backward, dlogits offset " + std::to_string(offset);
      Array<Elem> got(nans<Elem>(NV + 1));
      cuda::cross_entropy_backward(got.data() + offset, lg.data(), tgt.data(), 0.25f, N, V,
                                   nullptr);
      expect_near(dlogits.data(), got.data() + offset, NV, rel, what);
      keep(results, what, got.data() + offset, NV);
    }
  }

  {  // sum_of_squares, in double: several first-stage blocks and a partial one
    const size_t n = 100000;
    Array<Elem> sq(data(n, 13));
    for (const size_t offset : {size_t{0}, size_t{1}}) {
      const double want = cpu::sum_of_squares(kernel_pool(), sq.data() + offset, n - offset);
      Array<double> got(std::vector<double>(1, NAN));
      Scratch scratch(cuda::sum_of_squares_scratch_bytes(n - offset));
      cuda::sum_of_squares(got.data(), sq.data() + offset, n - offset, scratch.get(), nullptr);
      EXPECT_NEAR(want, got.data()[0], 1e-9 * want) << "sum_of_squares, offset " << offset;
      EXPECT_TRUE(scratch.intact()) << "sum_of_squares wrote past its scratch";
      keep(results, "sum_of_squares, offset " + std::to_string(offset), got.data(), 1);
    }
  }
  return results;
}

// The cases of test_cuda_backend.cc: C a multiple of the pack width (16-byte paths), and
// C = 30 with V = 37 (scalar paths; cross-entropy rows at every alignment). The kernels
// are deterministic by design, so a second schedule must give the same bits.
template <typename Elem>
void expect_matches_under_two_schedules(const Sizes& s, double rel) {
  cuda_emulation::set_schedule(Schedule::kRoundRobin);
  const Results first = expect_every_kernel_matches<Elem>(s, rel);
  cuda_emulation::set_schedule(Schedule::kRandom, 7);
  const Results second = expect_every_kernel_matches<Elem>(s, rel);
  cuda_emulation::set_schedule(Schedule::kRoundRobin);
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); i++) {
    EXPECT_TRUE(first[i].second == second[i].second)
        << first[i].first << " differs between the round-robin and random schedules";
  }
}

// RoPE: head size 8 (fp32) and 16 (bf16), HS/2 a whole pack, grouped-query heads (4 query,
// 2 key/value); head size 6 (3 pairs: scalar), multi-query (5 query heads, 1 key/value).
TEST(KernelsEmulated, EveryKernelMatchesTheCpuKernels) {
  expect_matches_under_two_schedules<float>({2, 9, 32, 50, 4, 2}, 2e-5);
  expect_matches_under_two_schedules<float>({2, 7, 30, 37, 5, 1}, 2e-5);
}

TEST(KernelsEmulated, EveryBf16KernelMatchesTheCpuBf16Kernels) {
  expect_matches_under_two_schedules<Bf16>({2, 9, 64, 50, 4, 2}, 2e-2);
  expect_matches_under_two_schedules<Bf16>({2, 7, 30, 37, 5, 1}, 2e-2);
}

// The emulated radix sort keeps CUB's protocol: a size query, then a sort that is stable.
TEST(KernelsEmulated, EncoderBackwardAddsRepeatedTokensInPositionOrder) {
  // One token everywhere: its row of dwte adds all B*T rows of dout, in position order.
  const int B = 3, T = 5, C = 8, V = 4;
  std::vector<int32_t> tokens(B * T, 2);
  std::vector<float> dout = randn(static_cast<size_t>(B) * T * C, 31);
  std::vector<float> dwte = randn(static_cast<size_t>(V) * C, 32), dwpe = randn(T * C, 33);
  Array<float> got_dwte(dwte), got_dwpe(dwpe), d(dout);
  Array<int32_t> tok(tokens);
  cpu::encoder_backward(kernel_pool(), dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T,
                        C);
  Scratch scratch(cuda::encoder_backward_scratch_bytes(B, T, C));
  cuda::encoder_backward(got_dwte.data(), got_dwpe.data(), d.data(), tok.data(), B, T, C,
                         scratch.get(), nullptr);
  // Same order of fp32 additions: the same bits.
  EXPECT_EQ(dwte, got_dwte.values());
  EXPECT_EQ(dwpe, got_dwpe.values());
}

// Byte data: one token (the space) at 80% of B*T = 8192 positions. Its run spans about
// 200 pieces, summed by as many blocks and added in order: the CPU kernel's bits, fp32
// and bf16, on the 16-byte path (C = 32) and the scalar one (C = 30), and within rounding
// of a double-precision sum. The CPU kernel is deterministic, so equal bits under a
// random schedule also mean the GPU's bits do not depend on the schedule.
template <typename Elem>
void expect_long_runs_match(int C, Schedule schedule) {
  SCOPED_TRACE(::testing::Message() << (sizeof(Elem) == 2 ? "bf16" : "fp32") << " C " << C
                                    << " schedule " << static_cast<int>(schedule));
  const int B = 4, T = 2048, V = 100, BT = B * T, kSpace = 32;
  Rng rng(77);
  std::vector<int32_t> tokens(BT);
  for (int& t : tokens)
    t = rng.next_u64() % 5 != 0 ? kSpace : static_cast<int32_t>(rng.next_u64() % V);
  ASSERT_GT(std::count(tokens.begin(), tokens.end(), kSpace), 6000);
  const std::vector<Elem> dout = stored<Elem>(randn(static_cast<size_t>(BT) * C, 41));
  std::vector<Elem> dwte = stored<Elem>(randn(static_cast<size_t>(V) * C, 42, 0.1f));
  std::vector<Elem> dwpe = stored<Elem>(randn(static_cast<size_t>(T) * C, 43, 0.1f));
  std::vector<double> exact(C);
  for (int c = 0; c < C; c++) {
    exact[c] = to_float(dwte[kSpace * C + c]);
    for (int bt = 0; bt < BT; bt++)
      if (tokens[bt] == kSpace) exact[c] += to_float(dout[static_cast<size_t>(bt) * C + c]);
  }
  cuda_emulation::set_schedule(schedule, 11);
  const std::vector<Elem> gpu = encoder_backward_on_both(dwte, dwpe, dout, tokens, B, T, C).first;
  cuda_emulation::set_schedule(Schedule::kRoundRobin);
  for (size_t i = 0; i < dwte.size(); i++)
    ASSERT_EQ(to_float(dwte[i]), to_float(gpu[i])) << "dwte[" << i << "]";
  for (int c = 0; c < C; c++) {
    const double tolerance = sizeof(Elem) == 2 ? std::fabs(exact[c]) / 128 + 0.1 : 1e-3;
    EXPECT_NEAR(to_float(gpu[kSpace * C + c]), exact[c], tolerance) << "dwte[space, " << c << "]";
  }
}

TEST(KernelsEmulated, EncoderBackwardSpreadsALongRunOverPiecesInTheCpuOrder) {
  expect_long_runs_match<float>(32, Schedule::kRoundRobin);
  expect_long_runs_match<float>(30, Schedule::kRoundRobin);
  expect_long_runs_match<Bf16>(32, Schedule::kRoundRobin);
  expect_long_runs_match<Bf16>(30, Schedule::kRoundRobin);
  expect_long_runs_match<float>(32, Schedule::kRandom);
  expect_long_runs_match<Bf16>(30, Schedule::kRandom);
}

}  // namespace
}  // namespace tandem
