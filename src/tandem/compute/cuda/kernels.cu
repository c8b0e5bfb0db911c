// Embedding, LayerNorm, RMSNorm, RoPE, SwiGLU, elementwise, cross-entropy and reduction
// kernels of the CUDA backend, for float and Bf16 storage (explicitly instantiated for both
// at the end).
//
// Sizes in the comments are GPT-2 124M's: C = 768, V = 50257, N = B*T = 16384 rows.
#include <cmath>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/compute/embedding_backward_order.h"
#include "tandem/core/error.h"
#include "tandem/device/cuda/cuda_check.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;
// Grid-stride loops never launch more blocks than this: several waves on any current GPU.
constexpr size_t kMaxBlocks = 8192;

constexpr float kLayerNormEps = 1e-5f;

// Blocks for a grid-stride loop over `work` items (at least one, so that a loop with only
// a scalar tail still runs).
unsigned blocks_for(size_t work, int threads = kThreads) {
  size_t blocks = (work + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- 16-byte loads and stores ---------------------------------------------------------

// Elements in 16 bytes: 4 floats or 8 bf16 values.
template <typename Elem>
constexpr int kPackWidth = 16 / static_cast<int>(sizeof(Elem));

// The unsigned type of each load width, so that one instruction moves a whole pack.
template <int kBytes>
struct RawBits;
template <>
struct RawBits<2> {
  using Type = uint16_t;
};
template <>
struct RawBits<4> {
  using Type = uint32_t;
};
template <>
struct RawBits<8> {
  using Type = uint2;
};
template <>
struct RawBits<16> {
  using Type = uint4;
};

template <typename Elem, int kWidth>
struct Pack {
  Elem e[kWidth];
};

template <typename Elem, int kWidth>
using RawPack = typename RawBits<static_cast<int>(sizeof(Elem)) * kWidth>::Type;

// dst[0, kWidth) = src[0, kWidth) as fp32. src must be aligned to kWidth elements (16
// bytes for a full pack); kWidth = 1 is an ordinary scalar load.
template <int kWidth, typename Elem>
__device__ __forceinline__ void load(float (&dst)[kWidth], const Elem* src) {
  const auto raw = *reinterpret_cast<const RawPack<Elem, kWidth>*>(src);
  const auto pack = bit_copy<Pack<Elem, kWidth>>(raw);
#pragma unroll
  for (int k = 0; k < kWidth; k++) dst[k] = to_float(pack.e[k]);
}

// dst[0, kWidth) = src rounded to Elem, with the alignment load() needs.
template <int kWidth, typename Elem>
__device__ __forceinline__ void store(Elem* dst, const float (&src)[kWidth]) {
  Pack<Elem, kWidth> pack;
#pragma unroll
  for (int k = 0; k < kWidth; k++) pack.e[k] = from_float<Elem>(src[k]);
  *reinterpret_cast<RawPack<Elem, kWidth>*>(dst) = bit_copy<RawPack<Elem, kWidth>>(pack);
}

// ---- reductions -----------------------------------------------------------------------

// Sum over a warp in a fixed butterfly order. Every lane ends with the same bits, since
// each step adds the same two values (a + b == b + a exactly).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// ---- elementwise kernels --------------------------------------------------------------

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;
// Beyond |x| = 20 GELU' is 1 or 0 to within 1e-35; clamping there keeps x^3 finite.
constexpr float kGeluBackwardClamp = 20.0f;
// exp(88) is finite in fp32, so the backward pass's sigma is never 1 / inf and e * sigma
// never inf * 0 (the CPU kernel clamps there too).
constexpr float kExpArgMax = 88.0f;

// GELU (tanh form) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as
// x * sigma with sigma = 1 / (1 + exp(-2u)) = 0.5 (1 + tanh(u)): the same formulation as
// the CPU kernel, and free of the cancellation in 1 + tanh(u) for negative x. No clamp at
// 88 here: below x = -10.07 exp(-2u) overflows to inf and sigma is exactly 0, as on the CPU
// (whose fast_exp overflows from 88.73 on); clamped, sigma would stop at 1 / exp(88) and
// GELU(-20) come out -1.2e-37 instead of -0.
struct GeluForward {
  __device__ float operator()(float x, float) const {
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float sigma = 1.0f / (1.0f + expf(-2.0f * u));
    return x * sigma;  // a NaN x stays NaN
  }
};

// GELU'(x) * dout, with sech^2(u) = 4 sigma (1 - sigma) and 1 - sigma = e sigma.
struct GeluBackward {
  __device__ float operator()(float x_in, float dout) const {
    const float x = fminf(fmaxf(x_in, -kGeluBackwardClamp), kGeluBackwardClamp);
    const float u = kGeluScale * (x + kGeluCube * x * x * x);
    const float e = expf(fminf(-2.0f * u, kExpArgMax));
    const float sigma = 1.0f / (1.0f + e);
    const float sech_sq = 4.0f * sigma * (e * sigma);
    const float grad = sigma + x * 0.5f * sech_sq * kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
    // x_in * 0 is 0 for finite inputs and NaN for NaN or inf ones, which the clamp hides.
    return (grad + x_in * 0.0f) * dout;
  }
};

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// out[i] = op(a[i], b[i]) (b unused when !kBinary), kWidth elements per step of a
// grid-stride loop. With kWidth > 1 every pointer is 16-byte aligned; the n % kWidth
// elements after the last whole pack are done one each by the first threads.
template <int kWidth, bool kBinary, typename Elem, typename Op>
__global__ void map_kernel(Elem* out, const Elem* a, const Elem* b, size_t n, Op op) {
  const size_t packs = n / kWidth;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t p = first; p < packs; p += stride) {
    float x[kWidth], y[kWidth] = {}, r[kWidth];
    load(x, a + p * kWidth);
    if constexpr (kBinary) load(y, b + p * kWidth);
#pragma unroll
    for (int k = 0; k < kWidth; k++) r[k] = op(x[k], y[k]);
    store(out + p * kWidth, r);
  }
  const size_t i = packs * kWidth + first;
  if (i < n) {
    float y = 0.0f;
    if constexpr (kBinary) y = to_float(b[i]);
    out[i] = from_float<Elem>(op(to_float(a[i]), y));
  }
}

template <bool kBinary, typename Elem, typename Op>
void launch_map(Elem* out, const Elem* a, const Elem* b, size_t n, Op op, cudaStream_t stream,
                const char* name) {
  if (n == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  if (aligned16(out) && aligned16(a) && (!kBinary || aligned16(b))) {
    map_kernel<kWidth, kBinary><<<blocks_for(n / kWidth), kThreads, 0, stream>>>(out, a, b, n, op);
  } else {
    map_kernel<1, kBinary><<<blocks_for(n), kThreads, 0, stream>>>(out, a, b, n, op);
  }
  check_launch(name);
}

// ---- encoder --------------------------------------------------------------------------

// One thread per kWidth channels of one position. wpe null (Llama: no position
// embedding) copies the token's row.
template <int kWidth, typename Elem>
__global__ void encoder_forward_kernel(Elem* out, const int32_t* tokens, const Elem* wte,
                                       const Elem* wpe, int BT, int T, int C) {
  const int row_packs = C / kWidth;
  const size_t packs = static_cast<size_t>(BT) * row_packs;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    const int bt = static_cast<int>(p / row_packs);
    const int c = static_cast<int>(p % row_packs) * kWidth;
    float x[kWidth];
    load(x, wte + static_cast<size_t>(tokens[bt]) * C + c);
    if (wpe != nullptr) {
      float y[kWidth];
      load(y, wpe + static_cast<size_t>(bt % T) * C + c);
#pragma unroll
      for (int k = 0; k < kWidth; k++) x[k] += y[k];
    }
    store(out + static_cast<size_t>(bt) * C + c, x);
  }
}

// dwpe[T,C] += sum over b of dout[b,t,:]: one thread per kWidth channels of a position,
// adding the batch in order onto the old value (the CPU kernel's order).
template <int kWidth, typename Elem>
__global__ void encoder_backward_wpe_kernel(Elem* dwpe, const Elem* dout, int B, int T, int C) {
  const int row_packs = C / kWidth;
  const size_t packs = static_cast<size_t>(T) * row_packs;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    const int t = static_cast<int>(p / row_packs);
    const int c = static_cast<int>(p % row_packs) * kWidth;
    Elem* dst = dwpe + static_cast<size_t>(t) * C + c;
    float acc[kWidth];
    load(acc, dst);
    for (int b = 0; b < B; b++) {
      float d[kWidth];
      load(d, dout + (static_cast<size_t>(b) * T + t) * C + c);
#pragma unroll
      for (int k = 0; k < kWidth; k++) acc[k] += d[k];
    }
    store(dst, acc);
  }
}

__global__ void iota_kernel(int32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

constexpr int kEncoderWteThreads = 128;

// fp32 rows of the piece sums: 16-byte accesses where kWidth allows.
template <int kWidth>
__device__ __forceinline__ void load_fp32(float (&dst)[kWidth], const float* src) {
  if constexpr (kWidth % 4 == 0) {
#pragma unroll
    for (int k = 0; k < kWidth; k += 4) {
      const float4 v = *reinterpret_cast<const float4*>(src + k);
      dst[k] = v.x, dst[k + 1] = v.y, dst[k + 2] = v.z, dst[k + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kWidth; k++) dst[k] = src[k];
  }
}
template <int kWidth>
__device__ __forceinline__ void store_fp32(float* dst, const float (&src)[kWidth]) {
  if constexpr (kWidth % 4 == 0) {
#pragma unroll
    for (int k = 0; k < kWidth; k += 4)
      *reinterpret_cast<float4*>(dst + k) = make_float4(src[k], src[k + 1], src[k + 2], src[k + 3]);
  } else {
#pragma unroll
    for (int k = 0; k < kWidth; k++) dst[k] = src[k];
  }
}

// dwte, step 1 of 2 (the order of embedding_backward_order.h): block w sums the pieces of
// the sorted positions [w K, w K + K), K = kEmbeddingBackwardPiece, each from zero in
// position order, into piece_sums[first sorted index of the piece, C] (fp32). A long run
// of one token is spread over as many blocks as it has pieces.
template <int kWidth, typename Elem>
__global__ void encoder_backward_wte_pieces_kernel(float* piece_sums, const Elem* dout,
                                                   const uint32_t* sorted_tokens,
                                                   const int32_t* sorted_positions, int BT, int C) {
  const int window = blockIdx.x * kEmbeddingBackwardPiece;
  const int window_end = min(BT, window + kEmbeddingBackwardPiece);
  for (int c = threadIdx.x * kWidth; c < C; c += blockDim.x * kWidth) {
    float acc[kWidth] = {};
    int piece = window;
    for (int j = window; j < window_end; j++) {
      float d[kWidth];
      load(d, dout + static_cast<size_t>(sorted_positions[j]) * C + c);
#pragma unroll
      for (int k = 0; k < kWidth; k++) acc[k] += d[k];
      if (j + 1 == window_end || sorted_tokens[j + 1] != sorted_tokens[j]) {
        store_fp32(piece_sums + static_cast<size_t>(piece) * C + c, acc);
#pragma unroll
        for (int k = 0; k < kWidth; k++) acc[k] = 0.0f;
        piece = j + 1;
      }
    }
  }
}

// dwte, step 2 of 2: block i starts work only where a run of equal tokens starts; that
// block alone owns the token's row of dwte and adds the run's pieces onto it in order,
// so the result is exactly the CPU kernel's.
template <int kWidth, typename Elem>
__global__ void encoder_backward_wte_kernel(Elem* dwte, const float* piece_sums,
                                            const uint32_t* sorted_tokens, int BT, int C) {
  const int first = blockIdx.x;
  const uint32_t token = sorted_tokens[first];
  if (first > 0 && sorted_tokens[first - 1] == token) return;  // the same for the whole block
  // The run is [first, end). Equal tokens are contiguous, so in each window of blockDim.x
  // positions the ones that match are a prefix: their count is how far the run goes on.
  int end = first + 1;
  for (;;) {
    const int j = end + static_cast<int>(threadIdx.x);
    const int matching = __syncthreads_count(j < BT && sorted_tokens[j] == token);
    end += matching;
    if (matching < static_cast<int>(blockDim.x)) break;
  }
  Elem* row = dwte + static_cast<size_t>(token) * C;
  for (int c = threadIdx.x * kWidth; c < C; c += blockDim.x * kWidth) {
    float acc[kWidth];
    load(acc, row + c);
    // The pieces start at `first` and at every multiple of the piece size after it.
    for (int piece = first; piece < end;
         piece = (piece / kEmbeddingBackwardPiece + 1) * kEmbeddingBackwardPiece) {
      float p[kWidth];
      load_fp32(p, piece_sums + static_cast<size_t>(piece) * C + c);
#pragma unroll
      for (int k = 0; k < kWidth; k++) acc[k] += p[k];
    }
    store(row + c, acc);
  }
}

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// cub's temporary storage for sorting BT (token, position) pairs.
size_t radix_sort_temp_bytes(int BT) {
  size_t bytes = 0;
  cuda_check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                             static_cast<uint32_t*>(nullptr),
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), BT, 0, 32),
             "cub::DeviceRadixSort::SortPairs (temporary storage size)");
  return bytes;
}

// encoder_backward's arrays in its scratch, each at a 256-byte boundary: byte offsets of
// the sorted tokens, the positions and the sorted positions ([BT] 4-byte integers each),
// the piece sums (fp32 [BT, C]: a piece's sum sits at the row of its first sorted index)
// and cub's temporary storage; the size query and the launcher both use it.
struct EncoderBackwardScratch {
  size_t sorted_tokens, positions, sorted_positions, piece_sums, sort_temp;
  size_t sort_temp_bytes, total_bytes;
};

EncoderBackwardScratch encoder_backward_scratch(int BT, int C) {
  EncoderBackwardScratch s{};
  size_t end = 0;
  const auto take = [&end](size_t bytes) {
    const size_t offset = end;
    end += round_up_256(bytes);
    return offset;
  };
  s.sorted_tokens = take(static_cast<size_t>(BT) * sizeof(uint32_t));
  s.positions = take(static_cast<size_t>(BT) * sizeof(int32_t));
  s.sorted_positions = take(static_cast<size_t>(BT) * sizeof(int32_t));
  s.piece_sums = take(static_cast<size_t>(BT) * C * sizeof(float));
  s.sort_temp_bytes = radix_sort_temp_bytes(BT);
  s.sort_temp = take(s.sort_temp_bytes);
  s.total_bytes = end;
  return s;
}

// ---- LayerNorm ------------------------------------------------------------------------

// One warp per row [C]; lane l handles packs l, l + 32, ... The row is read three times
// (mean, variance, output); the second and third reads mostly hit L1.
template <int kWidth, typename Elem>
__global__ void layernorm_forward_kernel(Elem* out, float* mean, float* rstd, const Elem* inp,
                                         const Elem* weight, const Elem* bias, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // the whole warp leaves together
  const Elem* x = inp + static_cast<size_t>(row) * C;
  float sum = 0.0f;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float v[kWidth];
    load(v, x + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) sum += v[k];
  }
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float v[kWidth];
    load(v, x + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      const float d = v[k] - m;
      var += d * d;
    }
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + kLayerNormEps);
  Elem* o = out + static_cast<size_t>(row) * C;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float v[kWidth], w[kWidth], b[kWidth], r[kWidth];
    load(v, x + c);
    load(w, weight + c);
    load(b, bias + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) r[k] = (v[k] - m) * s * w[k] + b[k];
    store(o + c, r);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp[row] += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, with
// dnorm = weight * dout and norm = (x - mean) * rstd; one warp per row.
template <int kWidth, typename Elem>
__global__ void layernorm_backward_input_kernel(Elem* dinp, const Elem* dout, const Elem* inp,
                                                const Elem* weight, const float* mean,
                                                const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t offset = static_cast<size_t>(row) * C;
  const Elem* x = inp + offset;
  const Elem* d = dout + offset;
  Elem* di = dinp + offset;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float xv[kWidth], dv[kWidth], wv[kWidth];
    load(xv, x + c);
    load(dv, d + c);
    load(wv, weight + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      const float norm = (xv[k] - m) * s;
      const float dnorm = wv[k] * dv[k];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float xv[kWidth], dv[kWidth], wv[kWidth], acc[kWidth];
    load(xv, x + c);
    load(dv, d + c);
    load(wv, weight + c);
    load(acc, di + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      const float norm = (xv[k] - m) * s;
      const float dnorm = wv[k] * dv[k];
      acc[k] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
    store(di + c, acc);
  }
}

// ---- column reductions (parameter gradients) --------------------------------------------
//
// Summing a column of x[N, C] with one thread per column would leave C threads each
// walking all N rows. Instead the rows are cut into fixed chunks: stage one writes the
// sum of each (chunk, column) to partial[chunks, C] (fp32), stage two adds the chunks of
// each column in a fixed tree and adds the result onto the output. Both stages depend
// only on N and C, so the result is the same on every run and every GPU.

struct RowChunks {
  int rows;   // rows per chunk
  int count;  // chunks
};

// At most 256 chunks of at least 16 rows: N = 16384 gives 256 chunks of 64 rows.
RowChunks row_chunks(int N) {
  constexpr int kMaxChunks = 256, kMinRows = 16;
  int rows = (N + kMaxChunks - 1) / kMaxChunks;
  if (rows < kMinRows) rows = kMinRows;
  return {rows, (N + rows - 1) / rows};
}

constexpr int kPartialThreads = 64;

// partial[chunk, c] = sum of x[n, c] over the chunk's rows, in row order; one thread per
// kWidth columns, blockIdx.y the chunk.
template <int kWidth, typename Elem>
__global__ void column_partials_kernel(float* partial, const Elem* x, int N, int C,
                                       int rows_per_chunk) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * kWidth;
  if (c >= C) return;
  const int n0 = blockIdx.y * rows_per_chunk;
  const int n1 = min(N, n0 + rows_per_chunk);
  float acc[kWidth] = {};
#pragma unroll 4
  for (int n = n0; n < n1; n++) {
    float v[kWidth];
    load(v, x + static_cast<size_t>(n) * C + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) acc[k] += v[k];
  }
  float* dst = partial + static_cast<size_t>(blockIdx.y) * C + c;
#pragma unroll
  for (int k = 0; k < kWidth; k++) dst[k] = acc[k];
}

// The LayerNorm parameter gradients' stage one: partial_dw[chunk, c] = sum of
// (x - mean) * rstd * dout, partial_db[chunk, c] = sum of dout over the chunk's rows.
template <int kWidth, typename Elem>
__global__ void layernorm_param_partials_kernel(float* partial_dw, float* partial_db,
                                                const Elem* dout, const Elem* inp,
                                                const float* mean, const float* rstd, int N, int C,
                                                int rows_per_chunk) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * kWidth;
  if (c >= C) return;
  const int n0 = blockIdx.y * rows_per_chunk;
  const int n1 = min(N, n0 + rows_per_chunk);
  float dw[kWidth] = {}, db[kWidth] = {};
#pragma unroll 4
  for (int n = n0; n < n1; n++) {
    const size_t offset = static_cast<size_t>(n) * C + c;
    const float m = mean[n], s = rstd[n];
    float xv[kWidth], dv[kWidth];
    load(xv, inp + offset);
    load(dv, dout + offset);
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      dw[k] += (xv[k] - m) * s * dv[k];
      db[k] += dv[k];
    }
  }
  const size_t at = static_cast<size_t>(blockIdx.y) * C + c;
#pragma unroll
  for (int k = 0; k < kWidth; k++) {
    partial_dw[at + k] = dw[k];
    partial_db[at + k] = db[k];
  }
}

constexpr int kFinishWarps = 8;

// Stage two: out[c] += sum over chunks of partial[chunk, c]. A block is 32 columns (the
// lanes) by kFinishWarps warps; warp w adds chunks w, w + 8, ... in order, then lane c of
// warp 0 adds the 8 warp sums in order. blockIdx.y picks (out0, partial0) or (out1,
// partial1), so LayerNorm's two gradients take one launch.
template <typename Elem>
__global__ void column_finish_kernel(Elem* out0, const float* partial0, Elem* out1,
                                     const float* partial1, int chunks, int C) {
  __shared__ float warp_sums[kFinishWarps][32];
  Elem* out = blockIdx.y == 0 ? out0 : out1;
  const float* partial = blockIdx.y == 0 ? partial0 : partial1;
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < C)
    for (int chunk = threadIdx.y; chunk < chunks; chunk += kFinishWarps)
      acc += partial[static_cast<size_t>(chunk) * C + c];
  warp_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kFinishWarps; w++) total += warp_sums[w][threadIdx.x];
    out[c] = from_float<Elem>(to_float(out[c]) + total);
  }
}

template <typename Elem>
void launch_column_finish(Elem* out0, const float* partial0, Elem* out1, const float* partial1,
                          int outputs, int chunks, int C, cudaStream_t stream) {
  const dim3 grid((C + 31) / 32, outputs), block(32, kFinishWarps);
  column_finish_kernel<<<grid, block, 0, stream>>>(out0, partial0, out1, partial1, chunks, C);
}

// Stage one's grid: kPartialThreads threads of kWidth columns each, by chunks.
dim3 partials_grid(int C, int width, int chunks) {
  const int blocks = (C / width + kPartialThreads - 1) / kPartialThreads;
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(chunks));
}

template <typename Elem>
__global__ void broadcast_rows_kernel(Elem* out, const Elem* bias, size_t total, int OC) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride)
    out[i] = bias[i % OC];
}

// ---- RMSNorm (Llama) ------------------------------------------------------------------
//
// As LayerNorm without the mean and the bias, in the CPU kernel's arithmetic: one warp per
// row for the row statistics and dinp, and the weight gradient through the column
// reductions above (chunks of rows, then a fixed tree), so one thread writes each output.
// A row is a row of the matrix, or one of `heads` heads of C columns within a row of
// `stride` (Qwen3's q and k norms): row r = (n, h) starts at n * stride + h * C.

struct NormRows {
  int heads, C, stride;
  __device__ size_t at(int r) const {
    return static_cast<size_t>(r / heads) * stride + static_cast<size_t>(r % heads) * C;
  }
};

// out[row] = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps); `count` rows.
template <int kWidth, typename Elem>
__global__ void rmsnorm_forward_kernel(Elem* out, float* rstd, const Elem* inp, const Elem* weight,
                                       float eps, int count, NormRows rows) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= count) return;  // the whole warp leaves together
  const int C = rows.C;
  const Elem* x = inp + rows.at(row);
  float sum = 0.0f;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float v[kWidth];
    load(v, x + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) sum += v[k] * v[k];
  }
  const float s = 1.0f / sqrtf(warp_sum(sum) / C + eps);
  Elem* o = out + rows.at(row);
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float v[kWidth], w[kWidth], r[kWidth];
    load(v, x + c);
    load(w, weight + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) r[k] = v[k] * s * w[k];
    store(o + c, r);
  }
  if (lane == 0) rstd[row] = s;
}

// dinp[row] (+= with `accumulate`, else =) (dnorm - x * rstd^2 * mean(dnorm * x)) * rstd,
// dnorm = weight * dout. Each lane writes only the columns it read, after the warp's sum:
// dinp may be dout when it is overwritten.
template <int kWidth, typename Elem>
__global__ void rmsnorm_backward_input_kernel(Elem* dinp, const Elem* dout, const Elem* inp,
                                              const Elem* weight, const float* rstd, int count,
                                              NormRows rows, bool accumulate) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= count) return;
  const int C = rows.C;
  const size_t offset = rows.at(row);
  const Elem* x = inp + offset;
  const Elem* d = dout + offset;
  Elem* di = dinp + offset;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float xv[kWidth], dv[kWidth], wv[kWidth];
    load(xv, x + c);
    load(dv, d + c);
    load(wv, weight + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) dot += wv[k] * dv[k] * xv[k];
  }
  const float m = warp_sum(dot) / C * s * s;
  for (int c = lane * kWidth; c < C; c += 32 * kWidth) {
    float xv[kWidth], dv[kWidth], wv[kWidth], acc[kWidth] = {};
    load(xv, x + c);
    load(dv, d + c);
    load(wv, weight + c);
    if (accumulate) load(acc, di + c);
#pragma unroll
    for (int k = 0; k < kWidth; k++) acc[k] += (wv[k] * dv[k] - xv[k] * m) * s;
    store(di + c, acc);
  }
}

// The weight gradient's stage one: partial[chunk, c] = sum of x * rstd * dout over the
// chunk's rows, in row order (column_finish_kernel is stage two).
template <int kWidth, typename Elem>
__global__ void rmsnorm_weight_partials_kernel(float* partial, const Elem* dout, const Elem* inp,
                                               const float* rstd, int count, NormRows rows,
                                               int rows_per_chunk) {
  const int C = rows.C;
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * kWidth;
  if (c >= C) return;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(count, r0 + rows_per_chunk);
  float dw[kWidth] = {};
#pragma unroll 4
  for (int r = r0; r < r1; r++) {
    const size_t offset = rows.at(r) + c;
    const float s = rstd[r];
    float xv[kWidth], dv[kWidth];
    load(xv, inp + offset);
    load(dv, dout + offset);
#pragma unroll
    for (int k = 0; k < kWidth; k++) dw[k] += xv[k] * s * dv[k];
  }
  float* dst = partial + static_cast<size_t>(blockIdx.y) * C + c;
#pragma unroll
  for (int k = 0; k < kWidth; k++) dst[k] = dw[k];
}

// ---- RoPE (Llama) ---------------------------------------------------------------------

// In place on the rotated_heads = NH + KVH query and key heads of qkv[BT, row_width]
// (row_width = (NH + 2 KVH) HS): one thread per kWidth pairs (x[i], x[i + HS/2]) of one
// head of one row, turned by cos_sin[t, i, 0..1] ([T, HS/2, 2] fp32); sign -1 turns them
// back (the backward pass: the Jacobian of a rotation is its transpose). With kWidth > 1,
// HS/2 is a multiple of kWidth, so both halves of every pack stay 16-byte aligned.
template <int kWidth, typename Elem>
__global__ void rope_kernel(Elem* qkv, const float* cos_sin, int BT, int T, int rotated_heads,
                            int row_width, int HS, float sign) {
  const int half = HS / 2, head_packs = half / kWidth;
  const size_t packs = static_cast<size_t>(BT) * rotated_heads * head_packs;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    const int i = static_cast<int>(p % head_packs) * kWidth;
    const size_t head = p / head_packs;  // (bt, h) over the rotated heads
    const int h = static_cast<int>(head % rotated_heads);
    const int bt = static_cast<int>(head / rotated_heads);
    Elem* x = qkv + static_cast<size_t>(bt) * row_width + static_cast<size_t>(h) * HS + i;
    const float* angles = cos_sin + (static_cast<size_t>(bt % T) * half + i) * 2;
    float x1[kWidth], x2[kWidth], r1[kWidth], r2[kWidth];
    load(x1, x);
    load(x2, x + half);
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      const float c = angles[2 * k], s = sign * angles[2 * k + 1];
      r1[k] = x1[k] * c - x2[k] * s;
      r2[k] = x2[k] * c + x1[k] * s;
    }
    store(x, r1);
    store(x + half, r2);
  }
}

template <typename Elem>
void launch_rope(Elem* qkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS, float sign,
                 cudaStream_t stream, const char* name) {
  const int BT = B * T, rotated_heads = NH + KVH, row_width = (NH + 2 * KVH) * HS;
  const size_t pairs = static_cast<size_t>(BT) * rotated_heads * (HS / 2);
  if (pairs == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  if ((HS / 2) % kWidth == 0 && aligned16(qkv)) {
    rope_kernel<kWidth><<<blocks_for(pairs / kWidth), kThreads, 0, stream>>>(
        qkv, cos_sin, BT, T, rotated_heads, row_width, HS, sign);
  } else {
    rope_kernel<1><<<blocks_for(pairs), kThreads, 0, stream>>>(qkv, cos_sin, BT, T, rotated_heads,
                                                               row_width, HS, sign);
  }
  check_launch(name);
}

// ---- SwiGLU (Llama) -------------------------------------------------------------------

// out[n, i] = silu(gate) * up with gate = inp[n, i], up = inp[n, I + i] (inp[N, 2I]); one
// thread per kWidth columns of a row. With kWidth > 1, I is a multiple of kWidth.
template <int kWidth, typename Elem>
__global__ void swiglu_forward_kernel(Elem* out, const Elem* inp, int N, int I) {
  const int row_packs = I / kWidth;
  const size_t packs = static_cast<size_t>(N) * row_packs;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    const size_t n = p / row_packs;
    const int i = static_cast<int>(p % row_packs) * kWidth;
    const Elem* gate = inp + n * 2 * I + i;
    float g[kWidth], u[kWidth], r[kWidth];
    load(g, gate);
    load(u, gate + I);
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      const float sigmoid = 1.0f / (1.0f + expf(-g[k]));
      r[k] = g[k] * sigmoid * u[k];
    }
    store(out + n * I + i, r);
  }
}

// dinp[n, i] = dout * up * silu'(gate), dinp[n, I + i] = dout * silu(gate), with
// silu'(g) = sigmoid (1 + g (1 - sigmoid)), as the CPU kernel computes them.
template <int kWidth, typename Elem>
__global__ void swiglu_backward_kernel(Elem* dinp, const Elem* inp, const Elem* dout, int N,
                                       int I) {
  const int row_packs = I / kWidth;
  const size_t packs = static_cast<size_t>(N) * row_packs;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs;
       p += stride) {
    const size_t n = p / row_packs;
    const int i = static_cast<int>(p % row_packs) * kWidth;
    const size_t at = n * 2 * I + i;
    float g[kWidth], u[kWidth], d[kWidth], dg[kWidth], du[kWidth];
    load(g, inp + at);
    load(u, inp + at + I);
    load(d, dout + n * I + i);
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      const float sigmoid = 1.0f / (1.0f + expf(-g[k]));
      dg[k] = d[k] * u[k] * (sigmoid * (1.0f + g[k] * (1.0f - sigmoid)));
      du[k] = d[k] * (g[k] * sigmoid);
    }
    store(dinp + at, dg);
    store(dinp + at + I, du);
  }
}

// ---- cross-entropy --------------------------------------------------------------------

constexpr int kCrossEntropyThreads = 512;

// A running log-sum-exp: the largest value seen and the sum of exp(value - max).
struct MaxSum {
  float max;
  float sum;
};

// exp() arguments are taken relative to `ref`: the max, or 0 while the max is -inf (only
// -inf seen so far), so that -inf - -inf never makes a NaN out of nothing; a NaN input
// still reaches the sum and makes the result NaN, as on the CPU.
__device__ __forceinline__ float exp_reference(float max) { return max == -INFINITY ? 0.0f : max; }

// Symmetric in a and b, bit for bit, so a butterfly leaves every lane the same value.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  const float ref = exp_reference(m);
  return {m, a.sum * expf(a.max - ref) + b.sum * expf(b.max - ref)};
}

// Adds kWidth values to the running state, rescaling the old sum only when the maximum
// grows (expf(0) = 1 exactly otherwise).
template <int kWidth>
__device__ __forceinline__ void absorb(MaxSum& state, const float (&v)[kWidth]) {
  float m = state.max;
#pragma unroll
  for (int k = 0; k < kWidth; k++) m = fmaxf(m, v[k]);
  const float ref = exp_reference(m);
  float sum = state.sum * expf(state.max - ref);
#pragma unroll
  for (int k = 0; k < kWidth; k++) sum += expf(v[k] - ref);
  state = {m, sum};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(kFullMask, x.max, offset),
                       __shfl_xor_sync(kFullMask, x.sum, offset)};
    x = merge(x, other);
  }
  return x;
}

// Merges the states of the whole block (blockDim.x a multiple of 32, at most 1024) into
// every thread. Called once per kernel: its shared memory is not reused.
__device__ MaxSum block_merge(MaxSum x) {
  __shared__ MaxSum warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_merge(x);
  if (lane == 0) warp_results[warp] = x;
  __syncthreads();
  x = lane < warps ? warp_results[lane] : MaxSum{-INFINITY, 0.0f};
  return warp_merge(x);
}

// Elements before the first 16-byte boundary of a row (0 when kWidth = 1): a row of
// V = 50257 values starts anywhere, so the vector loop begins after this scalar head.
template <int kWidth, typename Elem>
__device__ __forceinline__ int row_head(const Elem* row, int V) {
  if (kWidth == 1) return 0;
  const unsigned offset = static_cast<unsigned>(reinterpret_cast<uintptr_t>(row) % 16);
  const int head = offset == 0 ? 0 : static_cast<int>((16 - offset) / sizeof(Elem));
  return head < V ? head : V;
}

// logsumexp of row[V] in one pass (an online softmax), in every thread of the block.
template <int kWidth, typename Elem>
__device__ float row_logsumexp(const Elem* row, int V, int head) {
  MaxSum state{-INFINITY, 0.0f};
  for (int v = threadIdx.x; v < head; v += blockDim.x) {
    const float x[1] = {to_float(row[v])};
    absorb(state, x);
  }
  const int packs = (V - head) / kWidth;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    float x[kWidth];
    load(x, row + head + p * kWidth);
    absorb(state, x);
  }
  for (int v = head + packs * kWidth + threadIdx.x; v < V; v += blockDim.x) {
    const float x[1] = {to_float(row[v])};
    absorb(state, x);
  }
  state = block_merge(state);
  return state.max + logf(state.sum);
}

// One block per row of logits[N, V].
template <int kWidth, typename Elem>
__global__ void cross_entropy_forward_kernel(float* losses, const Elem* logits,
                                             const int32_t* targets, int V) {
  const Elem* row = logits + static_cast<size_t>(blockIdx.x) * V;
  const float lse = row_logsumexp<kWidth>(row, V, row_head<kWidth>(row, V));
  const int target = targets[blockIdx.x];  // negative: not counted (kIgnoredTarget)
  if (threadIdx.x == 0) losses[blockIdx.x] = target < 0 ? 0.0f : lse - to_float(row[target]);
}

// One block per row: the log-sum-exp pass, then a pass writing dloss * (p - onehot). With
// kWidth > 1, logits and dlogits have the same offset from a 16-byte boundary, so one
// head serves both.
template <int kWidth, typename Elem>
__global__ void cross_entropy_backward_kernel(Elem* dlogits, const Elem* logits,
                                              const int32_t* targets, float dloss, int V) {
  const size_t offset = static_cast<size_t>(blockIdx.x) * V;
  const Elem* row = logits + offset;
  Elem* drow = dlogits + offset;
  const int head = row_head<kWidth>(row, V);
  const int target = targets[blockIdx.x];
  if (target < 0) {  // not counted (kIgnoredTarget): a zero row; the whole block leaves
    for (int v = threadIdx.x; v < V; v += blockDim.x) drow[v] = from_float<Elem>(0.0f);
    return;
  }
  const float lse = row_logsumexp<kWidth>(row, V, head);
  // The CPU kernel's arithmetic: dloss * p, minus dloss at the target.
  const auto grad = [&](float x, int v) {
    return dloss * expf(x - lse) - (v == target ? dloss : 0.0f);
  };
  for (int v = threadIdx.x; v < head; v += blockDim.x)
    drow[v] = from_float<Elem>(grad(to_float(row[v]), v));
  const int packs = (V - head) / kWidth;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const int v0 = head + p * kWidth;
    float x[kWidth], r[kWidth];
    load(x, row + v0);
#pragma unroll
    for (int k = 0; k < kWidth; k++) r[k] = grad(x[k], v0 + k);
    store(drow + v0, r);
  }
  for (int v = head + packs * kWidth + threadIdx.x; v < V; v += blockDim.x)
    drow[v] = from_float<Elem>(grad(to_float(row[v]), v));
}

// ---- sum of squares -------------------------------------------------------------------

// Elements per first-stage block: fixed (not a function of the GPU) so that the sum is
// the same everywhere, and a multiple of every pack width so each block stays aligned.
constexpr size_t kSquaresBlock = size_t{1} << 14;
constexpr int kSquaresThreads = 256;

size_t squares_blocks(size_t n) { return (n + kSquaresBlock - 1) / kSquaresBlock; }

// Sum over the block (blockDim.x == kSquaresThreads) in a fixed tree.
__device__ double block_sum(double x) {
  __shared__ double shared[kSquaresThreads];
  shared[threadIdx.x] = x;
  __syncthreads();
  for (int stride = kSquaresThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

// partial[i] = sum of x[j]^2 over j in [i * kSquaresBlock, (i + 1) * kSquaresBlock).
template <int kWidth, typename Elem>
__global__ void squares_partial_kernel(double* partial, const Elem* x, size_t n) {
  const size_t begin = static_cast<size_t>(blockIdx.x) * kSquaresBlock;
  const size_t count = n - begin < kSquaresBlock ? n - begin : kSquaresBlock;
  const Elem* segment = x + begin;
  const size_t packs = count / kWidth;
  double sum = 0.0;
  for (size_t p = threadIdx.x; p < packs; p += blockDim.x) {
    float v[kWidth];
    load(v, segment + p * kWidth);
#pragma unroll
    for (int k = 0; k < kWidth; k++) sum += static_cast<double>(v[k]) * static_cast<double>(v[k]);
  }
  for (size_t i = packs * kWidth + threadIdx.x; i < count; i += blockDim.x) {
    const double v = to_float(segment[i]);
    sum += v * v;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// *result = sum of partial[blocks] one after another, in block order (one thread: a few
// thousand additions for a billion parameters), so that block sums gathered from several
// ranks' partitions and added in order on the host give the same bits.
__global__ void squares_finish_kernel(double* result, const double* partial, size_t blocks) {
  double sum = 0.0;
  for (size_t i = 0; i < blocks; i++) sum += partial[i];
  *result = sum;
}

}  // namespace

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    fail("CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorString(err));
}

// ---- encoder --------------------------------------------------------------------------

template <typename Elem>
void encoder_forward(Elem* out, const int32_t* tokens, const Elem* wte, const Elem* wpe, int B,
                     int T, int C, cudaStream_t stream) {
  const int BT = B * T;
  if (BT == 0 || C == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  if (C % kWidth == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe)) {
    encoder_forward_kernel<kWidth>
        <<<blocks_for(static_cast<size_t>(BT) * (C / kWidth)), kThreads, 0, stream>>>(
            out, tokens, wte, wpe, BT, T, C);
  } else {
    encoder_forward_kernel<1><<<blocks_for(static_cast<size_t>(BT) * C), kThreads, 0, stream>>>(
        out, tokens, wte, wpe, BT, T, C);
  }
  check_launch("encoder_forward");
}

size_t encoder_backward_scratch_bytes(int B, int T, int C) {
  const int BT = B * T;
  if (BT == 0 || C == 0) return 0;
  return encoder_backward_scratch(BT, C).total_bytes;
}

template <typename Elem>
void encoder_backward(Elem* dwte, Elem* dwpe, const Elem* dout, const int32_t* tokens, int B, int T,
                      int C, void* scratch, cudaStream_t stream) {
  const int BT = B * T;
  if (BT == 0 || C == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  const bool vector = C % kWidth == 0 && aligned16(dout);

  if (dwpe != nullptr) {  // null: no position embedding (Llama)
    if (vector && aligned16(dwpe)) {
      encoder_backward_wpe_kernel<kWidth>
          <<<blocks_for(static_cast<size_t>(T) * (C / kWidth)), kThreads, 0, stream>>>(dwpe, dout,
                                                                                       B, T, C);
    } else {
      encoder_backward_wpe_kernel<1>
          <<<blocks_for(static_cast<size_t>(T) * C), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
    }
    check_launch("encoder_backward (dwpe)");
  }

  // Sort (token, position) pairs by token. Token ids are non-negative, so as uint32 keys
  // they sort in the same order; the radix sort is stable, so each token's positions stay
  // in increasing order.
  const EncoderBackwardScratch layout = encoder_backward_scratch(BT, C);
  auto* base = static_cast<char*>(scratch);
  auto* sorted_tokens = reinterpret_cast<uint32_t*>(base + layout.sorted_tokens);
  auto* positions = reinterpret_cast<int32_t*>(base + layout.positions);
  auto* sorted_positions = reinterpret_cast<int32_t*>(base + layout.sorted_positions);
  auto* piece_sums = reinterpret_cast<float*>(base + layout.piece_sums);
  void* temp = base + layout.sort_temp;
  size_t temp_bytes = layout.sort_temp_bytes;
  iota_kernel<<<(BT + kThreads - 1) / kThreads, kThreads, 0, stream>>>(positions, BT);
  check_launch("encoder_backward (positions)");
  cuda_check(cub::DeviceRadixSort::SortPairs(
                 temp, temp_bytes, reinterpret_cast<const uint32_t*>(tokens), sorted_tokens,
                 positions, sorted_positions, BT, 0, 32, stream),
             "cub::DeviceRadixSort::SortPairs (encoder_backward)");

  const unsigned windows = (BT + kEmbeddingBackwardPiece - 1) / kEmbeddingBackwardPiece;
  if (vector) {
    encoder_backward_wte_pieces_kernel<kWidth><<<windows, kEncoderWteThreads, 0, stream>>>(
        piece_sums, dout, sorted_tokens, sorted_positions, BT, C);
  } else {
    encoder_backward_wte_pieces_kernel<1><<<windows, kEncoderWteThreads, 0, stream>>>(
        piece_sums, dout, sorted_tokens, sorted_positions, BT, C);
  }
  check_launch("encoder_backward (dwte pieces)");
  if (vector && aligned16(dwte)) {
    encoder_backward_wte_kernel<kWidth>
        <<<BT, kEncoderWteThreads, 0, stream>>>(dwte, piece_sums, sorted_tokens, BT, C);
  } else {
    encoder_backward_wte_kernel<1>
        <<<BT, kEncoderWteThreads, 0, stream>>>(dwte, piece_sums, sorted_tokens, BT, C);
  }
  check_launch("encoder_backward (dwte)");
}

// ---- LayerNorm ------------------------------------------------------------------------

template <typename Elem>
void layernorm_forward(Elem* out, float* mean, float* rstd, const Elem* inp, const Elem* weight,
                       const Elem* bias, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  const unsigned blocks = static_cast<unsigned>((N + kThreads / 32 - 1) / (kThreads / 32));
  if (C % kWidth == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) && aligned16(bias)) {
    layernorm_forward_kernel<kWidth>
        <<<blocks, kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  } else {
    layernorm_forward_kernel<1>
        <<<blocks, kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  }
  check_launch("layernorm_forward");
}

size_t layernorm_backward_scratch_bytes(int N, int C) {
  if (N == 0) return 0;
  return 2 * round_up_256(static_cast<size_t>(row_chunks(N).count) * C * sizeof(float));
}

template <typename Elem>
void layernorm_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout, const Elem* inp,
                        const Elem* weight, const float* mean, const float* rstd, int N, int C,
                        void* scratch, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  const bool vector = C % kWidth == 0 && aligned16(dout) && aligned16(inp);

  const unsigned blocks = static_cast<unsigned>((N + kThreads / 32 - 1) / (kThreads / 32));
  if (vector && aligned16(dinp) && aligned16(weight)) {
    layernorm_backward_input_kernel<kWidth>
        <<<blocks, kThreads, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  } else {
    layernorm_backward_input_kernel<1>
        <<<blocks, kThreads, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  check_launch("layernorm_backward (dinp)");

  const RowChunks chunks = row_chunks(N);
  auto* partial_dw = static_cast<float*>(scratch);
  auto* partial_db =
      reinterpret_cast<float*>(static_cast<char*>(scratch) +
                               round_up_256(static_cast<size_t>(chunks.count) * C * sizeof(float)));
  if (vector) {
    layernorm_param_partials_kernel<kWidth>
        <<<partials_grid(C, kWidth, chunks.count), kPartialThreads, 0, stream>>>(
            partial_dw, partial_db, dout, inp, mean, rstd, N, C, chunks.rows);
  } else {
    layernorm_param_partials_kernel<1>
        <<<partials_grid(C, 1, chunks.count), kPartialThreads, 0, stream>>>(
            partial_dw, partial_db, dout, inp, mean, rstd, N, C, chunks.rows);
  }
  check_launch("layernorm_backward (parameter partials)");
  launch_column_finish(dweight, partial_dw, dbias, partial_db, 2, chunks.count, C, stream);
  check_launch("layernorm_backward (parameter sums)");
}

// ---- RMSNorm --------------------------------------------------------------------------

namespace {

template <typename Elem>
void launch_rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps,
                            int count, NormRows rows, cudaStream_t stream, const char* what) {
  if (count == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  const unsigned blocks = static_cast<unsigned>((count + kThreads / 32 - 1) / (kThreads / 32));
  if (rows.C % kWidth == 0 && rows.stride % kWidth == 0 && aligned16(out) && aligned16(inp) &&
      aligned16(weight)) {
    rmsnorm_forward_kernel<kWidth>
        <<<blocks, kThreads, 0, stream>>>(out, rstd, inp, weight, eps, count, rows);
  } else {
    rmsnorm_forward_kernel<1>
        <<<blocks, kThreads, 0, stream>>>(out, rstd, inp, weight, eps, count, rows);
  }
  check_launch(what);
}

// The weight gradient first, so that an overwritten dinp may be dout.
template <typename Elem>
void launch_rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                             const Elem* weight, const float* rstd, int count, NormRows rows,
                             bool accumulate, void* scratch, cudaStream_t stream) {
  if (count == 0 || rows.C == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  const int C = rows.C;
  const bool vector =
      C % kWidth == 0 && rows.stride % kWidth == 0 && aligned16(dout) && aligned16(inp);

  const RowChunks chunks = row_chunks(count);
  auto* partial = static_cast<float*>(scratch);
  if (vector) {
    rmsnorm_weight_partials_kernel<kWidth>
        <<<partials_grid(C, kWidth, chunks.count), kPartialThreads, 0, stream>>>(
            partial, dout, inp, rstd, count, rows, chunks.rows);
  } else {
    rmsnorm_weight_partials_kernel<1>
        <<<partials_grid(C, 1, chunks.count), kPartialThreads, 0, stream>>>(
            partial, dout, inp, rstd, count, rows, chunks.rows);
  }
  check_launch("rmsnorm_backward (weight partials)");
  launch_column_finish(dweight, partial, dweight, partial, 1, chunks.count, C, stream);
  check_launch("rmsnorm_backward (weight sums)");

  const unsigned blocks = static_cast<unsigned>((count + kThreads / 32 - 1) / (kThreads / 32));
  if (vector && aligned16(dinp) && aligned16(weight)) {
    rmsnorm_backward_input_kernel<kWidth>
        <<<blocks, kThreads, 0, stream>>>(dinp, dout, inp, weight, rstd, count, rows, accumulate);
  } else {
    rmsnorm_backward_input_kernel<1>
        <<<blocks, kThreads, 0, stream>>>(dinp, dout, inp, weight, rstd, count, rows, accumulate);
  }
  check_launch("rmsnorm_backward (dinp)");
}

}  // namespace

template <typename Elem>
void rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps, int N,
                     int C, cudaStream_t stream) {
  launch_rmsnorm_forward(out, rstd, inp, weight, eps, N, NormRows{1, C, C}, stream,
                         "rmsnorm_forward");
}

size_t rmsnorm_backward_scratch_bytes(int N, int C) {
  if (N == 0) return 0;
  return round_up_256(static_cast<size_t>(row_chunks(N).count) * C * sizeof(float));
}

template <typename Elem>
void rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                      const Elem* weight, const float* rstd, int N, int C, void* scratch,
                      cudaStream_t stream) {
  launch_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, NormRows{1, C, C}, true,
                          scratch, stream);
}

template <typename Elem>
void head_rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps,
                          int N, int H, int HS, int row_stride, cudaStream_t stream) {
  launch_rmsnorm_forward(out, rstd, inp, weight, eps, N * H, NormRows{H, HS, row_stride}, stream,
                         "head_rmsnorm_forward");
}

size_t head_rmsnorm_backward_scratch_bytes(int N, int H, int HS) {
  return rmsnorm_backward_scratch_bytes(N * H, HS);
}

template <typename Elem>
void head_rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                           const Elem* weight, const float* rstd, int N, int H, int HS,
                           int row_stride, void* scratch, cudaStream_t stream) {
  launch_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N * H,
                          NormRows{H, HS, row_stride}, false, scratch, stream);
}

// ---- RoPE -----------------------------------------------------------------------------

template <typename Elem>
void rope_forward(Elem* qkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS,
                  cudaStream_t stream) {
  launch_rope(qkv, cos_sin, B, T, NH, KVH, HS, 1.0f, stream, "rope_forward");
}

template <typename Elem>
void rope_backward(Elem* dqkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS,
                   cudaStream_t stream) {
  launch_rope(dqkv, cos_sin, B, T, NH, KVH, HS, -1.0f, stream, "rope_backward");
}

// ---- SwiGLU ---------------------------------------------------------------------------

template <typename Elem>
void swiglu_forward(Elem* out, const Elem* inp, int N, int I, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(N) * I;
  if (n == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  if (I % kWidth == 0 && aligned16(out) && aligned16(inp)) {
    swiglu_forward_kernel<kWidth><<<blocks_for(n / kWidth), kThreads, 0, stream>>>(out, inp, N, I);
  } else {
    swiglu_forward_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(out, inp, N, I);
  }
  check_launch("swiglu_forward");
}

template <typename Elem>
void swiglu_backward(Elem* dinp, const Elem* inp, const Elem* dout, int N, int I,
                     cudaStream_t stream) {
  const size_t n = static_cast<size_t>(N) * I;
  if (n == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  if (I % kWidth == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
    swiglu_backward_kernel<kWidth>
        <<<blocks_for(n / kWidth), kThreads, 0, stream>>>(dinp, inp, dout, N, I);
  } else {
    swiglu_backward_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(dinp, inp, dout, N, I);
  }
  check_launch("swiglu_backward");
}

// ---- matmul helpers -------------------------------------------------------------------

template <typename Elem>
void broadcast_rows(Elem* out, const Elem* bias, int N, int OC, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(N) * OC;
  if (total == 0) return;
  broadcast_rows_kernel<<<blocks_for(total), kThreads, 0, stream>>>(out, bias, total, OC);
  check_launch("broadcast_rows");
}

size_t column_sums_scratch_bytes(int N, int C) {
  if (N == 0) return 0;
  return round_up_256(static_cast<size_t>(row_chunks(N).count) * C * sizeof(float));
}

template <typename Elem>
void column_sums_accumulate(Elem* sum, const Elem* x, int N, int C, void* scratch,
                            cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  constexpr int kWidth = kPackWidth<Elem>;
  const RowChunks chunks = row_chunks(N);
  auto* partial = static_cast<float*>(scratch);
  if (C % kWidth == 0 && aligned16(x)) {
    column_partials_kernel<kWidth>
        <<<partials_grid(C, kWidth, chunks.count), kPartialThreads, 0, stream>>>(partial, x, N, C,
                                                                                 chunks.rows);
  } else {
    column_partials_kernel<1><<<partials_grid(C, 1, chunks.count), kPartialThreads, 0, stream>>>(
        partial, x, N, C, chunks.rows);
  }
  check_launch("column_sums (partials)");
  launch_column_finish(sum, partial, sum, partial, 1, chunks.count, C, stream);
  check_launch("column_sums (sums)");
}

// ---- elementwise ----------------------------------------------------------------------

template <typename Elem>
void gelu_forward(Elem* out, const Elem* inp, size_t N, cudaStream_t stream) {
  launch_map<false>(out, inp, static_cast<const Elem*>(nullptr), N, GeluForward{}, stream,
                    "gelu_forward");
}

template <typename Elem>
void gelu_backward(Elem* dinp, const Elem* inp, const Elem* dout, size_t N, cudaStream_t stream) {
  launch_map<true>(dinp, inp, dout, N, GeluBackward{}, stream, "gelu_backward");
}

template <typename Elem>
void residual_forward(Elem* out, const Elem* a, const Elem* b, size_t N, cudaStream_t stream) {
  launch_map<true>(out, a, b, N, Add{}, stream, "residual_forward");
}

// ---- cross-entropy --------------------------------------------------------------------

template <typename Elem>
void cross_entropy_forward(float* losses, const Elem* logits, const int32_t* targets, int N, int V,
                           cudaStream_t stream) {
  if (N == 0) return;
  // Any row start works: each row finds its own 16-byte boundary.
  cross_entropy_forward_kernel<kPackWidth<Elem>>
      <<<N, kCrossEntropyThreads, 0, stream>>>(losses, logits, targets, V);
  check_launch("cross_entropy_forward");
}

template <typename Elem>
void cross_entropy_backward(Elem* dlogits, const Elem* logits, const int32_t* targets, float dloss,
                            int N, int V, cudaStream_t stream) {
  if (N == 0) return;
  const bool same_offset =
      reinterpret_cast<uintptr_t>(logits) % 16 == reinterpret_cast<uintptr_t>(dlogits) % 16;
  if (same_offset) {
    cross_entropy_backward_kernel<kPackWidth<Elem>>
        <<<N, kCrossEntropyThreads, 0, stream>>>(dlogits, logits, targets, dloss, V);
  } else {
    cross_entropy_backward_kernel<1>
        <<<N, kCrossEntropyThreads, 0, stream>>>(dlogits, logits, targets, dloss, V);
  }
  check_launch("cross_entropy_backward");
}

// ---- sum of squares -------------------------------------------------------------------

size_t sum_of_squares_scratch_bytes(size_t n) { return squares_blocks(n) * sizeof(double); }

template <typename Elem>
void sum_of_squares_blocks(double* partial, const Elem* x, size_t n, cudaStream_t stream) {
  const size_t blocks = squares_blocks(n);
  if (blocks == 0) return;
  if (aligned16(x)) {
    squares_partial_kernel<kPackWidth<Elem>>
        <<<static_cast<unsigned>(blocks), kSquaresThreads, 0, stream>>>(partial, x, n);
  } else {
    squares_partial_kernel<1>
        <<<static_cast<unsigned>(blocks), kSquaresThreads, 0, stream>>>(partial, x, n);
  }
  check_launch("sum_of_squares (blocks)");
}

template <typename Elem>
void sum_of_squares(double* result, const Elem* x, size_t n, void* scratch, cudaStream_t stream) {
  auto* partial = static_cast<double*>(scratch);
  sum_of_squares_blocks(partial, x, n, stream);
  squares_finish_kernel<<<1, 1, 0, stream>>>(result, partial, squares_blocks(n));
  check_launch("sum_of_squares (total)");
}

// ---- instantiations -------------------------------------------------------------------

#define TANDEM_INSTANTIATE_KERNELS(Elem)                                                           \
  template void encoder_forward<Elem>(Elem*, const int32_t*, const Elem*, const Elem*, int, int,   \
                                      int, cudaStream_t);                                          \
  template void encoder_backward<Elem>(Elem*, Elem*, const Elem*, const int32_t*, int, int, int,   \
                                       void*, cudaStream_t);                                       \
  template void layernorm_forward<Elem>(Elem*, float*, float*, const Elem*, const Elem*,           \
                                        const Elem*, int, int, cudaStream_t);                      \
  template void layernorm_backward<Elem>(Elem*, Elem*, Elem*, const Elem*, const Elem*,            \
                                         const Elem*, const float*, const float*, int, int, void*, \
                                         cudaStream_t);                                            \
  template void broadcast_rows<Elem>(Elem*, const Elem*, int, int, cudaStream_t);                  \
  template void column_sums_accumulate<Elem>(Elem*, const Elem*, int, int, void*, cudaStream_t);   \
  template void gelu_forward<Elem>(Elem*, const Elem*, size_t, cudaStream_t);                      \
  template void gelu_backward<Elem>(Elem*, const Elem*, const Elem*, size_t, cudaStream_t);        \
  template void residual_forward<Elem>(Elem*, const Elem*, const Elem*, size_t, cudaStream_t);     \
  template void cross_entropy_forward<Elem>(float*, const Elem*, const int32_t*, int, int,         \
                                            cudaStream_t);                                         \
  template void cross_entropy_backward<Elem>(Elem*, const Elem*, const int32_t*, float, int, int,  \
                                             cudaStream_t);                                        \
  template void sum_of_squares<Elem>(double*, const Elem*, size_t, void*, cudaStream_t);           \
  template void sum_of_squares_blocks<Elem>(double*, const Elem*, size_t, cudaStream_t);           \
  template void rmsnorm_forward<Elem>(Elem*, float*, const Elem*, const Elem*, float, int, int,    \
                                      cudaStream_t);                                               \
  template void rmsnorm_backward<Elem>(Elem*, Elem*, const Elem*, const Elem*, const Elem*,        \
                                       const float*, int, int, void*, cudaStream_t);               \
  template void head_rmsnorm_forward<Elem>(Elem*, float*, const Elem*, const Elem*, float, int,    \
                                           int, int, int, cudaStream_t);                           \
  template void head_rmsnorm_backward<Elem>(Elem*, Elem*, const Elem*, const Elem*, const Elem*,   \
                                            const float*, int, int, int, int, void*,               \
                                            cudaStream_t);                                         \
  template void rope_forward<Elem>(Elem*, const float*, int, int, int, int, int, cudaStream_t);    \
  template void rope_backward<Elem>(Elem*, const float*, int, int, int, int, int, cudaStream_t);   \
  template void swiglu_forward<Elem>(Elem*, const Elem*, int, int, cudaStream_t);                  \
  template void swiglu_backward<Elem>(Elem*, const Elem*, const Elem*, int, int, cudaStream_t);

TANDEM_INSTANTIATE_KERNELS(float)
TANDEM_INSTANTIATE_KERNELS(Bf16)

#undef TANDEM_INSTANTIATE_KERNELS

}  // namespace tandem::cuda
