// Causal multi-head attention with grouped-query heads, flash-attention style (see
// flash_attention.cuh for the contract). Two implementations of the same tiled algorithm:
//
//  - Tensor cores (Elem = Bf16, head size a multiple of 8, 16-byte aligned tensors): bf16
//    mma.sync m16n8k16 with fp32 accumulation, laid out as in FlashAttention-2. Each warp
//    owns 16 rows of a 64-row tile and keeps its scores, probabilities and output
//    accumulators in registers (the mma C fragments); only q, k, v, dout and stored dS
//    tiles go through shared memory. The probabilities and dS are rounded to bf16 as mma
//    inputs.
//  - SIMT (float, and Bf16 where the above does not apply): fp32 FMA-free arithmetic on
//    shared-memory tiles, each thread computing a 4 x 8 register micro-tile.
//
// Tiles: 64 queries x 64 keys, 128 threads (4 warps). 16 rows per warp is the mma's M;
// 64 keys keep a warp's score fragment at 32 registers per thread; a bf16 tile of 64 rows
// x hs=64 is 9 KiB, so the forward kernel's q tile and double-buffered k, v tiles (45 KiB)
// let several blocks share an SM (4 on sm_90 at hs=64: mma_forward_min_blocks); and only
// the diagonal tile needs a causal mask. GPT-2 at T = 1024 gives 16 query tiles per head,
// so 16 * B * NH blocks: many waves, scheduled heaviest (longest causal row) first.
//
// The head size is a template parameter HSP, hs rounded up to 16, 32, 64 or 128: register
// arrays need compile-time sizes. Columns hs..HSP-1 and rows past T are zero in shared
// memory, so they add nothing to the dot products and the mma inputs are never garbage.
//
// Backward: the dk/dv pass (one block per key tile, over the query tiles from the diagonal
// on) recomputes P from lse, forms dS = P (dP - D) and, besides dk and dv, stores dS^T tiles
// in scratch memory (flash_attention.cuh has the layout); the dq pass (one block per query
// tile) is then one product per tile pair, dq += dS k, where FlashAttention-2 would add
// into dq atomically and a recomputing dq pass would redo q k^T and dout v^T. Where the
// scratch does not hold every head's dS tiles, both passes run over chunks of heads.
//
// Grouped-query attention (KVH < NH): query head h reads key/value head h / (NH / KVH). The
// forward and dq blocks are per query head and just read that head's k and v. A dk/dv block
// is per key/value head: it runs the query steps of each query head of its group in turn,
// adding them into the same registers, so a key/value head's gradient sums its query heads
// in head order with one writer and no atomics (and with one head per group, KVH = NH, it is
// the multi-head pass unchanged, bit for bit).
//
// Determinism: no atomics. The forward pass and dq have one block per query tile, dk, dv
// and dS one block per key tile (of a key/value head); each output element is written once
// by one thread, and every sum (register loops, fixed-order shuffles, mma chains) runs in
// an order fixed by the code.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "tandem/compute/cuda/flash_attention.cuh"
#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/core/error.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kTile = 64;      // rows (queries or keys) per tile
constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Geometry {
  int B, T;
  int C;        // NH * hs: the row width of out and dout
  int NH;       // query heads
  int KVH;      // key/value heads (KVH = NH: multi-head attention)
  int group;    // NH / KVH: query head h attends with key/value head h / group
  int hs;       // head size
  float scale;  // 1 / sqrt(hs)
};

// ---- Hardware primitives: the only code that is PTX or a kernel launch ----------------

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char flash_smem[];
  return flash_smem;
}

// Four 8 x 8 matrices of 16-bit elements from shared memory. Lane l gives the address of
// row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); register i receives matrix i's
// fragment: lane l gets row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (the lower column in
// the low half). The .trans form delivers the transpose: rows 2 (l % 4) and 2 (l % 4) + 1 of
// column l / 4. The "memory" clobber keeps the loads after the __syncthreads that
// published the tile.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}

// d[16 x 8] += a[16 x 16] b[16 x 8], bf16 inputs, fp32 accumulation. With g = lane / 4 and
// c = 2 (lane % 4): a = {(g, c..c+1), (g+8, c..c+1), (g, c+8..c+9), (g+8, c+8..c+9)},
// b = {(k = c..c+1, n = g), (k = c+8..c+9, n = g)}, d = {(g, c), (g, c+1), (g+8, c),
// (g+8, c+1)}; pairs hold the lower index in the low half.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to nearest-even bf16 (as from_float<Bf16> does), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return bit_copy<uint32_t>(__floats2bfloat162_rn(lo, hi));
}

// Asynchronous global -> shared copies (sm_80+): 16 bytes (or 4), or zeros where !valid
// (src-size 0: nothing is read, so src need only be some valid address). A thread's
// copies land by its cp_async_wait<N>, which leaves only its N most recently committed
// groups in flight; other threads see them after a __syncthreads that follows the wait.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Launches kernel on grid x kThreads with smem_bytes of dynamic shared memory, opting in
// past the default 48 KiB where needed.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, size_t smem_bytes, cudaStream_t stream, const char* name,
            Args... args) {
  if (smem_bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: the error is reported here
      fail("CUDA kernel ", name, " needs ", smem_bytes,
           " bytes of shared memory per block, more than this GPU allows: ",
           cudaGetErrorString(err));
    }
  }
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args...);
  check_launch(name);
}

// ---- End of hardware primitives ------------------------------------------------------

// Index of (b, h, t) in the [B, NH, T] statistics (lse, delta).
__device__ __forceinline__ size_t stat_index(const Geometry& g, int b, int h, int t) {
  return (static_cast<size_t>(b) * g.NH + h) * g.T + t;
}

// Offset of head h's first column in row (b, 0) of a [B, T, width] tensor.
__device__ __forceinline__ size_t head_offset(const Geometry& g, int b, int h, size_t width) {
  return static_cast<size_t>(b) * g.T * width + static_cast<size_t>(h) * g.hs;
}

// A row of qkv: NH query heads, then KVH key heads, then KVH value heads.
__host__ __device__ __forceinline__ size_t qkv_width(const Geometry& g) {
  return static_cast<size_t>(g.NH + 2 * g.KVH) * g.hs;
}
// Offsets in qkv of row (b, 0) of query head h, and of key and value head kvh.
__device__ __forceinline__ size_t q_offset(const Geometry& g, int b, int h) {
  return head_offset(g, b, h, qkv_width(g));
}
__device__ __forceinline__ size_t k_offset(const Geometry& g, int b, int kvh) {
  return head_offset(g, b, g.NH + kvh, qkv_width(g));
}
__device__ __forceinline__ size_t v_offset(const Geometry& g, int b, int kvh) {
  return head_offset(g, b, g.NH + g.KVH + kvh, qkv_width(g));
}

// Tile pairs (query tile i, key tile j <= i) of one head: those with a causal dS tile.
__host__ __device__ __forceinline__ size_t tile_pairs(int T) {
  const size_t tiles = (static_cast<size_t>(T) + kTile - 1) / kTile;
  return tiles * (tiles + 1) / 2;
}

// Offset of tile pair (query tile i, key tile j) of the chunk's head `head` in the dS
// scratch [heads][pairs][64 keys][64 queries]: the pairs of query tile i are consecutive.
__device__ __forceinline__ size_t ds_tile_offset(const Geometry& g, int head, int i, int j) {
  const size_t pair = static_cast<size_t>(i) * (i + 1) / 2 + j;
  return (static_cast<size_t>(head) * tile_pairs(g.T) + pair) * kTile * kTile;
}

// D[b, h, t] = dout[b, t, head h] . out[b, t, head h]. This equals sum_t2 P[t, t2]
// dP[t, t2], which the backward kernels subtract in dS = P (dP - D).
//
// One warp per row (b, t) of C elements: the lanes copy consecutive 16-byte packs of dout
// and out into shared memory as fp32 (coalesced reads), then lane h sums head h's products
// in index order, as the fallback below does and as the SIMT kernels' dP dot products
// run, so that D cancels against them exactly where it should (one key: dS = 0). Each
// head's row is padded to hs + 1 floats so that the lanes' column walks hit distinct
// banks. Needs hs a multiple of the pack and 16-byte aligned tensors; delta_kernel below
// is the fallback.
template <typename Elem>
struct Pack16 {
  Elem e[16 / sizeof(Elem)];
};
constexpr int kDeltaWarps = kThreads / 32;
// Shared memory of delta_packed_kernel: dout and out rows of every warp, heads padded.
size_t delta_packed_smem(int C, int NH) {
  return sizeof(float) * kDeltaWarps * 2 * (static_cast<size_t>(C) + NH);
}
template <typename Elem>
__global__ void __launch_bounds__(kThreads)
    delta_packed_kernel(float* delta, const Elem* dout, const Elem* out, Geometry g) {
  constexpr int kWidth = 16 / sizeof(Elem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int padded = g.C + g.NH;  // floats per staged row
  float* d_row = reinterpret_cast<float*>(dynamic_smem()) + warp * 2 * padded;
  float* o_row = d_row + padded;
  const size_t bt = static_cast<size_t>(blockIdx.x) * kDeltaWarps + warp;
  if (bt >= static_cast<size_t>(g.B) * g.T) return;  // the whole warp
  const uint4* d = reinterpret_cast<const uint4*>(dout + bt * g.C);
  const uint4* o = reinterpret_cast<const uint4*>(out + bt * g.C);
  for (int p = lane; p < g.C / kWidth; p += 32) {
    const Pack16<Elem> dp = bit_copy<Pack16<Elem>>(d[p]), op = bit_copy<Pack16<Elem>>(o[p]);
    const int i = p * kWidth, at = i + i / g.hs;  // a pack never straddles two heads
#pragma unroll
    for (int k = 0; k < kWidth; k++) {
      d_row[at + k] = to_float(dp.e[k]);
      o_row[at + k] = to_float(op.e[k]);
    }
  }
  __syncwarp();
  const int b = static_cast<int>(bt / g.T), t = static_cast<int>(bt % g.T);
  for (int h = lane; h < g.NH; h += 32) {
    const float* dh = d_row + h * (g.hs + 1);
    const float* oh = o_row + h * (g.hs + 1);
    float sum = 0.0f;
    for (int i = 0; i < g.hs; i++) sum += dh[i] * oh[i];
    delta[stat_index(g, b, h, t)] = sum;
  }
}

// The fallback: one thread per (b, t, h), in index order.
template <typename Elem>
__global__ void delta_kernel(float* delta, const Elem* dout, const Elem* out, Geometry g) {
  const size_t index = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // [B, T, NH]
  if (index >= static_cast<size_t>(g.B) * g.T * g.NH) return;
  const int h = static_cast<int>(index % g.NH);
  const size_t bt = index / g.NH;
  const int b = static_cast<int>(bt / g.T), t = static_cast<int>(bt % g.T);
  const size_t offset = bt * g.C + static_cast<size_t>(h) * g.hs;
  float sum = 0.0f;
  for (int i = 0; i < g.hs; i++) sum += to_float(dout[offset + i]) * to_float(out[offset + i]);
  delta[stat_index(g, b, h, t)] = sum;
}

// ======================================================================================
// SIMT kernels (fp32 arithmetic on Elem storage)
// ======================================================================================
//
// Shared tiles hold rows of HSP floats at a stride of HSP + 1, so a column walk (the dot
// products below) hits distinct banks. Thread (ty, tx) = (tid / 8, tid % 8) owns rows
// 4 ty .. 4 ty + 3 of the 64-row tile: warp w owns rows 16 w .. 16 w + 15, so data that
// only those rows need passes between its threads with __syncwarp, not __syncthreads.
// The thread's columns are tx + 8 j: eight threads read eight consecutive words.

// dst[r][d] (stride HSP + 1) = src row (row0 + r), column d, as float; zero past T or hs.
template <typename Elem, int HSP, int ROWS>
__device__ __forceinline__ void load_rows_f32(float* dst, const Elem* src, size_t stride, int row0,
                                              int T, int hs) {
  constexpr int P = HSP + 1;
  static_assert(ROWS * HSP % kThreads == 0, "whole rounds of copies");
#pragma unroll 8
  for (int round = 0; round < ROWS * HSP / kThreads; round++) {
    const int i = round * kThreads + threadIdx.x;
    const int r = i / HSP, d = i % HSP;
    float x = 0.0f;
    if (row0 + r < T && d < hs) x = to_float(src[static_cast<size_t>(row0 + r) * stride + d]);
    dst[r * P + d] = x;
  }
}

// s[i][j] = a[4 ty + i] . b[tx + 8 j] over the HSP columns, in column order; a and b are
// [64][HSP + 1] tiles.
template <int HSP>
__device__ __forceinline__ void simt_dots(float (&s)[4][8], const float* a, const float* b, int ty,
                                          int tx) {
  constexpr int P = HSP + 1;
#pragma unroll
  for (int i = 0; i < 4; i++) {
#pragma unroll
    for (int j = 0; j < 8; j++) s[i][j] = 0.0f;
  }
#pragma unroll 8
  for (int d = 0; d < HSP; d++) {
    float av[4], bv[8];
#pragma unroll
    for (int i = 0; i < 4; i++) av[i] = a[(4 * ty + i) * P + d];
#pragma unroll
    for (int j = 0; j < 8; j++) bv[j] = b[(tx + 8 * j) * P + d];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
      for (int j = 0; j < 8; j++) s[i][j] += av[i] * bv[j];
    }
  }
}

// acc[i][jd] += sum_{k < n} w[4 ty + i][k] x[k][tx + 8 jd], k in order; w is [64][65],
// x is [64][HSP + 1].
template <int HSP>
__device__ __forceinline__ void simt_weighted_rows(float (&acc)[4][HSP / 8], const float* w,
                                                   const float* x, int n, int ty, int tx) {
  constexpr int P = HSP + 1;
#pragma unroll 4
  for (int k = 0; k < n; k++) {
    float wv[4], xv[HSP / 8];
#pragma unroll
    for (int i = 0; i < 4; i++) wv[i] = w[(4 * ty + i) * (kTile + 1) + k];
#pragma unroll
    for (int jd = 0; jd < HSP / 8; jd++) xv[jd] = x[k * P + tx + 8 * jd];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
      for (int jd = 0; jd < HSP / 8; jd++) acc[i][jd] += wv[i] * xv[jd];
    }
  }
}

// Sums (or maxes) over the 8 threads tx = 0..7 that share rows, in a butterfly whose
// result is the same bits in all 8.
__device__ __forceinline__ float sum_over_row_threads(float x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  x += __shfl_xor_sync(kFullMask, x, 2);
  x += __shfl_xor_sync(kFullMask, x, 4);
  return x;
}
__device__ __forceinline__ float max_over_row_threads(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 4));
  return x;
}

template <int HSP>
constexpr size_t simt_forward_smem() {  // q, k, v tiles and p [64][65]
  return sizeof(float) * (3 * kTile * (HSP + 1) + kTile * (kTile + 1));
}
template <int HSP>
constexpr size_t simt_dkv_smem() {  // k, v, q, dout tiles, p and dS [64][65], lse and D [64]
  return sizeof(float) * (4 * kTile * (HSP + 1) + 2 * kTile * (kTile + 1) + 2 * kTile);
}
template <int HSP>
constexpr size_t simt_dq_smem() {  // k tile and dS [64][65]
  return sizeof(float) * (kTile * (HSP + 1) + kTile * (kTile + 1));
}

// Grid (query tiles, B * NH): query head h with key/value head h / group. Online softmax
// over key tiles 0..tile: per row a running max m and sum l of exp(s - m); on a new max the
// sum and the output accumulators are scaled by exp(m_old - m_new).
template <typename Elem, int HSP>
__global__ void __launch_bounds__(kThreads)
    simt_forward_kernel(Elem* out, float* lse, const Elem* qkv, Geometry g) {
  constexpr int P = HSP + 1;
  float* qs = reinterpret_cast<float*>(dynamic_smem());
  float* ks = qs + kTile * P;
  float* vs = ks + kTile * P;
  float* ps = vs + kTile * P;  // this tile's probabilities, [64][65]
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest rows first
  const int q0 = tile * kTile;
  const int b = static_cast<int>(blockIdx.y) / g.NH, h = static_cast<int>(blockIdx.y) % g.NH;
  const size_t stride = qkv_width(g);
  const Elem* q_head = qkv + q_offset(g, b, h);
  const Elem* k_head = qkv + k_offset(g, b, h / g.group);
  const Elem* v_head = qkv + v_offset(g, b, h / g.group);
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  load_rows_f32<Elem, HSP, kTile>(qs, q_head, stride, q0, g.T, g.hs);

  float acc[4][HSP / 8] = {};
  float row_max[4], row_sum[4];
#pragma unroll
  for (int i = 0; i < 4; i++) row_max[i] = -INFINITY, row_sum[i] = 0.0f;
  for (int kt = 0; kt <= tile; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // all threads are done with the previous k, v (and p) tiles
    load_rows_f32<Elem, HSP, kTile>(ks, k_head, stride, k0, g.T, g.hs);
    load_rows_f32<Elem, HSP, kTile>(vs, v_head, stride, k0, g.T, g.hs);
    __syncthreads();
    float s[4][8];
    simt_dots<HSP>(s, qs, ks, ty, tx);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; j++) {
        // Causal: on the diagonal tile (k0 == q0) key column c is masked beyond row r.
        // Row 0 keeps key k0, so no row is ever fully masked.
        s[i][j] = kt == tile && tx + 8 * j > 4 * ty + i ? -INFINITY : s[i][j] * g.scale;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      const float new_max = fmaxf(row_max[i], max_over_row_threads(tile_max));
      const float correction = expf(row_max[i] - new_max);  // 0 on the first tile
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; j++) {
        s[i][j] = expf(s[i][j] - new_max);
        sum += s[i][j];
        ps[(4 * ty + i) * (kTile + 1) + tx + 8 * j] = s[i][j];
      }
      row_sum[i] = row_sum[i] * correction + sum_over_row_threads(sum);
      row_max[i] = new_max;
#pragma unroll
      for (int jd = 0; jd < HSP / 8; jd++) acc[i][jd] *= correction;
    }
    __syncwarp();  // p rows 16 w .. 16 w + 15 are written and read by warp w only
    simt_weighted_rows<HSP>(acc, ps, vs, min(kTile, g.T - k0), ty, tx);
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int t = q0 + 4 * ty + i;
    if (t >= g.T) continue;
    Elem* o = out + (static_cast<size_t>(b) * g.T + t) * g.C + static_cast<size_t>(h) * g.hs;
#pragma unroll
    for (int jd = 0; jd < HSP / 8; jd++) {
      const int d = tx + 8 * jd;
      if (d < g.hs) o[d] = from_float<Elem>(acc[i][jd] / row_sum[i]);
    }
    if (tx == 0) lse[stat_index(g, b, h, t)] = row_max[i] + logf(row_sum[i]);
  }
}

// Grid (key tiles, key/value heads of the chunk from unit0 on): dk and dv of one key tile of
// key/value head (b, kvh), over its group's query heads in order and, for each, the query
// tiles from the diagonal on (earlier queries see none of these keys); and the dS^T tiles
// (scale included) of those tile pairs into ds. So the group's contributions add up in
// registers in a fixed order, with no other block writing these dk, dv. Thread rows are
// keys, columns queries: s^T = k q^T, dP^T = v dout^T.
template <typename Elem, int HSP>
__global__ void __launch_bounds__(kThreads)
    simt_backward_dkv_kernel(Elem* dqkv, Elem* ds, const Elem* dout, const Elem* qkv,
                             const float* lse, const float* delta, Geometry g, int unit0) {
  constexpr int P = HSP + 1;
  float* ks = reinterpret_cast<float*>(dynamic_smem());
  float* vs = ks + kTile * P;
  float* qs = vs + kTile * P;
  float* dos = qs + kTile * P;
  float* ps = dos + kTile * P;            // P^T [64 keys][65]
  float* dss = ps + kTile * (kTile + 1);  // dS^T * scale [64 keys][65]
  float* lse_s = dss + kTile * (kTile + 1);
  float* delta_s = lse_s + kTile;
  const int k0 = static_cast<int>(blockIdx.x) * kTile;  // key tile 0 (the most work) first
  const int unit = unit0 + static_cast<int>(blockIdx.y), b = unit / g.KVH, kvh = unit % g.KVH;
  const size_t stride = qkv_width(g);
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  load_rows_f32<Elem, HSP, kTile>(ks, qkv + k_offset(g, b, kvh), stride, k0, g.T, g.hs);
  load_rows_f32<Elem, HSP, kTile>(vs, qkv + v_offset(g, b, kvh), stride, k0, g.T, g.hs);

  float dk[4][HSP / 8] = {}, dv[4][HSP / 8] = {};
  for (int r = 0; r < g.group; r++) {
    const int h = kvh * g.group + r;
    const int chunk_head = static_cast<int>(blockIdx.y) * g.group + r;  // its dS in the chunk
    const Elem* q_head = qkv + q_offset(g, b, h);
    const Elem* dout_head = dout + head_offset(g, b, h, g.C);
    for (int q0 = k0; q0 < g.T; q0 += kTile) {
      __syncthreads();  // all threads are done with the previous q, dout, p, dS tiles
      load_rows_f32<Elem, HSP, kTile>(qs, q_head, stride, q0, g.T, g.hs);
      load_rows_f32<Elem, HSP, kTile>(dos, dout_head, g.C, q0, g.T, g.hs);
      if (threadIdx.x < kTile) {
        const int t = q0 + threadIdx.x;
        lse_s[threadIdx.x] = t < g.T ? lse[stat_index(g, b, h, t)] : 0.0f;
        delta_s[threadIdx.x] = t < g.T ? delta[stat_index(g, b, h, t)] : 0.0f;
      }
      __syncthreads();
      float s[4][8], dp[4][8];
      simt_dots<HSP>(s, ks, qs, ty, tx);
      simt_dots<HSP>(dp, vs, dos, ty, tx);
      // Every element of the tile pair is stored, zeros past T included: the dq pass reads
      // whole tiles.
      Elem* ds_tile = ds + ds_tile_offset(g, chunk_head, q0 / kTile, k0 / kTile);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int key = k0 + 4 * ty + i;
#pragma unroll
        for (int j = 0; j < 8; j++) {
          const int c = tx + 8 * j, t = q0 + c;
          const float p = t >= key && t < g.T ? expf(s[i][j] * g.scale - lse_s[c]) : 0.0f;
          const float ds_scaled = p * (dp[i][j] - delta_s[c]) * g.scale;
          ps[(4 * ty + i) * (kTile + 1) + c] = p;
          dss[(4 * ty + i) * (kTile + 1) + c] = ds_scaled;
          ds_tile[(4 * ty + i) * kTile + c] = from_float<Elem>(ds_scaled);  // 8 threads: 32 B
        }
      }
      __syncwarp();  // p, dS rows 16 w .. 16 w + 15 belong to warp w
      const int n = min(kTile, g.T - q0);
      simt_weighted_rows<HSP>(dv, ps, dos, n, ty, tx);  // dv += P^T dout
      simt_weighted_rows<HSP>(dk, dss, qs, n, ty, tx);  // dk += dS^T q (scale included)
    }
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int key = k0 + 4 * ty + i;
    if (key >= g.T) continue;
    Elem* dk_row = dqkv + k_offset(g, b, kvh) + static_cast<size_t>(key) * stride;
    Elem* dv_row = dqkv + v_offset(g, b, kvh) + static_cast<size_t>(key) * stride;
#pragma unroll
    for (int jd = 0; jd < HSP / 8; jd++) {
      const int d = tx + 8 * jd;
      if (d >= g.hs) continue;
      dk_row[d] = from_float<Elem>(dk[i][jd]);
      dv_row[d] = from_float<Elem>(dv[i][jd]);
    }
  }
}

// Grid (query tiles, query heads of the chunk from bh0 on): dq = dS k of one query tile over
// key tiles 0..tile (of the head's key/value head), from the dS^T tiles (scale included)
// that simt_backward_dkv_kernel stored.
template <typename Elem, int HSP>
__global__ void __launch_bounds__(kThreads)
    simt_backward_dq_kernel(Elem* dqkv, const Elem* ds, const Elem* qkv, Geometry g, int bh0) {
  constexpr int P = HSP + 1;
  float* ks = reinterpret_cast<float*>(dynamic_smem());
  float* dss = ks + kTile * P;                                    // dS * scale [64 queries][65]
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest rows first
  const int q0 = tile * kTile;
  const int bh = bh0 + static_cast<int>(blockIdx.y), b = bh / g.NH, h = bh % g.NH;
  const size_t stride = qkv_width(g);
  const Elem* k_head = qkv + k_offset(g, b, h / g.group);
  const Elem* ds_row = ds + ds_tile_offset(g, static_cast<int>(blockIdx.y), tile, 0);
  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;

  float dq[4][HSP / 8] = {};
  for (int kt = 0; kt <= tile; kt++) {
    const int k0 = kt * kTile;
    __syncthreads();  // all threads are done with the previous k and dS tiles
    load_rows_f32<Elem, HSP, kTile>(ks, k_head, stride, k0, g.T, g.hs);
    // dS^T[key][query] is read along its rows (coalesced) and transposed into dss[query][key];
    // the row stride of 65 keeps the column writes of 32 consecutive queries in distinct banks.
    const Elem* ds_tile = ds_row + static_cast<size_t>(kt) * kTile * kTile;
#pragma unroll 8
    for (int round = 0; round < kTile * kTile / kThreads; round++) {
      const int i = round * kThreads + threadIdx.x, key = i / kTile, query = i % kTile;
      dss[query * (kTile + 1) + key] = to_float(ds_tile[i]);
    }
    __syncthreads();
    simt_weighted_rows<HSP>(dq, dss, ks, min(kTile, g.T - k0), ty, tx);  // dq += dS k
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int t = q0 + 4 * ty + i;
    if (t >= g.T) continue;
    Elem* row = dqkv + q_offset(g, b, h) + static_cast<size_t>(t) * stride;
#pragma unroll
    for (int jd = 0; jd < HSP / 8; jd++) {
      const int d = tx + 8 * jd;
      if (d < g.hs) row[d] = from_float<Elem>(dq[i][jd]);
    }
  }
}

// ======================================================================================
// Tensor-core kernels (bf16 storage, fp32 accumulation)
// ======================================================================================
//
// Shared tiles hold rows of HSP bf16 at a stride of HSP + 8 elements: 16-byte aligned rows
// for ldmatrix, whose eight row addresses per matrix then fall in distinct bank groups.
// Warp w owns rows 16 w .. 16 w + 15 of its 64-row tile. In an mma C fragment, thread
// lane holds rows g = lane / 4 and g + 8 (of the warp's 16) and, in every 8-column
// n-tile, columns 2 (lane % 4) and 2 (lane % 4) + 1: element c of n-tile nt is
// (g + 8 (c / 2), 8 nt + 2 (lane % 4) + c % 2).
//
// The tiles a kernel loops over are double-buffered: the copy of step i + 1 (cp.async)
// is in flight while step i computes. Each step: issue the next copies into the other
// buffer, commit, wait for all but that newest group, __syncthreads (everyone's copies of
// step i have landed), compute, __syncthreads (no warp still reads the buffer that step
// i + 1 refills).

// Issues copies of rows row0 .. row0 + ROWS - 1 of src (HSP bf16 each, 16 bytes at a
// time) into dst (row stride HSP + 8); zeros past T or hs (hs is a multiple of 8).
template <int HSP, int ROWS>
__device__ __forceinline__ void copy_rows_async(uint16_t* dst, const uint16_t* src, size_t stride,
                                                int row0, int T, int hs) {
  constexpr int kChunks = HSP / 8;
  static_assert(ROWS * kChunks % kThreads == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int round = 0; round < ROWS * kChunks / kThreads; round++) {
    const int i = round * kThreads + threadIdx.x;
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = row0 + r < T && c < hs;
    cp_async_16(dst + r * (HSP + 8) + c,
                valid ? src + static_cast<size_t>(row0 + r) * stride + c : src, valid);
  }
}

// Issues copies of stat[t0 .. t0 + n - 1] (one head's [T] row of lse or D) into dst; zeros
// past T.
__device__ __forceinline__ void copy_stats_async(float* dst, const float* stat, int t0, int n,
                                                 int T) {
  if (static_cast<int>(threadIdx.x) < n) {
    const int t = t0 + threadIdx.x;
    cp_async_4(dst + threadIdx.x, t < T ? stat + t : stat, t < T);
  }
}

// acc[16 x 8 NT] += a[16 x 16 KS] b^T for this warp: a is 16 rows, b 8 NT rows, both with
// the 16 KS reduction columns contiguous in shared memory (row stride `stride`).
template <int NT, int KS>
__device__ __forceinline__ void warp_mma_abt(float (&acc)[NT][4], const uint16_t* a,
                                             const uint16_t* b, int stride, int lane) {
  static_assert(NT % 2 == 0, "n-tiles are loaded in pairs");
  const int matrix = lane / 8, row = lane % 8;
#pragma unroll
  for (int ks = 0; ks < KS; ks++) {
    // Matrices: rows 0-7 and 8-15 at columns +0, then at columns +8 (the a0..a7 order).
    uint32_t af[4];
    ldmatrix_x4(af, a + (lane % 16) * stride + ks * 16 + (lane / 16) * 8);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      // Matrices: n-tile nt at columns +0, +8, then n-tile nt + 1 at +0, +8: each pair
      // is one n-tile's (b0 b1, b2 b3), since b[k][n] = row n, column k.
      uint32_t bf[4];
      ldmatrix_x4(bf, b + ((nt + matrix / 2) * 8 + row) * stride + ks * 16 + (matrix % 2) * 8);
      mma_bf16_16816(acc[nt], af, bf[0], bf[1]);
      mma_bf16_16816(acc[nt + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[16 x 8 DN] += a[16 x 16] x[16 rows, from x] for this warp, given a's A fragment;
// x holds 8 DN contiguous columns per row in shared memory (row stride `stride`).
template <int DN>
__device__ __forceinline__ void warp_mma_slice(float (&acc)[DN][4], const uint32_t (&af)[4],
                                               const uint16_t* x, int stride, int lane) {
  static_assert(DN % 2 == 0, "n-tiles are loaded in pairs");
  const int matrix = lane / 8, row = lane % 8;
#pragma unroll
  for (int dn = 0; dn < DN; dn += 2) {
    // Transposed loads of rows 0-7 and 8-15 of column block dn, then of dn + 1: b[k][n]
    // = x[k][n] with k = 2 (lane % 4) + {0, 1} (+ 8), n = lane / 4.
    uint32_t bf[4];
    ldmatrix_x4_trans(bf, x + ((matrix % 2) * 8 + row) * stride + (dn + matrix / 2) * 8);
    mma_bf16_16816(acc[dn], af, bf[0], bf[1]);
    mma_bf16_16816(acc[dn + 1], af, bf[2], bf[3]);
  }
}

// acc[16 x 8 DN] += p[16 x 16 KS] x for this warp, where p is in registers as the C
// fragments of 2 KS n-tiles (so a warp_mma_abt result, rounded to bf16) and x is 16 KS rows
// of 8 DN contiguous columns in shared memory (row stride `stride`).
template <int KS, int DN>
__device__ __forceinline__ void warp_mma_pb(float (&acc)[DN][4], const float (&p)[2 * KS][4],
                                            const uint16_t* x, int stride, int lane) {
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    // The C fragments of n-tiles 2 kk and 2 kk + 1 are exactly the A fragment of a
    // 16-column slice: (g, c..c+1), (g+8, c..c+1), (g, c+8..c+9), (g+8, c+8..c+9).
    const uint32_t af[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]),
                            pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                            pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
    warp_mma_slice<DN>(acc, af, x + kk * 16 * stride, stride, lane);
  }
}

// acc[16 x 8 DN] += at^T x for this warp, where at is 16 KS rows (the reduction index) of
// 16 contiguous columns (this warp's output rows) in shared memory (row stride at_stride),
// and x is as in warp_mma_pb.
template <int KS, int DN>
__device__ __forceinline__ void warp_mma_atb(float (&acc)[DN][4], const uint16_t* at, int at_stride,
                                             const uint16_t* x, int stride, int lane) {
  const int matrix = lane / 8, row = lane % 8;
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    // Transposed loads give the A fragment (g, c..c+1), (g+8, c..c+1), (g, c+8..c+9),
    // (g+8, c+8..c+9): matrix m holds reduction rows 8 (m / 2) .. + 7 of output rows
    // 8 (m % 2) .. + 7.
    uint32_t af[4];
    ldmatrix_x4_trans(af, at + (kk * 16 + (matrix / 2) * 8 + row) * at_stride + (matrix % 2) * 8);
    warp_mma_slice<DN>(acc, af, x + kk * 16 * stride, stride, lane);
  }
}

// Stores two floats as adjacent bf16 (4-byte aligned), rounded as from_float<Bf16>.
__device__ __forceinline__ void store_bf16x2(Bf16* dst, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(dst) =
      static_cast<uint32_t>(float_to_bf16(lo)) | static_cast<uint32_t>(float_to_bf16(hi)) << 16;
}

// The backward kernels step through the other sequence dimension 32 rows at a time when
// HSP = 128: with 64 they would hold 2 x 64 accumulators + 2 x 32 scores per thread.
template <int HSP>
constexpr int mma_backward_step() {
  return HSP <= 64 ? 64 : 32;
}
template <int HSP>
constexpr size_t mma_forward_smem() {  // q tile, 2 x (k, v tiles)
  return sizeof(uint16_t) * 5 * kTile * (HSP + 8);
}
template <int HSP>
constexpr size_t mma_dkv_smem() {  // k, v tiles, 2 x (q, dout steps), 2 x (lse, D per step row)
  constexpr int kStep = mma_backward_step<HSP>();
  return sizeof(uint16_t) * (2 * kTile + 4 * kStep) * (HSP + 8) + sizeof(float) * 4 * kStep;
}
template <int HSP>
constexpr size_t mma_dq_smem() {  // 2 x (dS^T tile [64][72], k tile [64][HSP + 8])
  return sizeof(uint16_t) * 2 * kTile * ((kTile + 8) + (HSP + 8));
}

// Blocks per SM the forward kernel is compiled for (__launch_bounds__), as many as shared
// memory lets an SM hold (its tiles take 5 x 64 x (HSP + 8) bf16, plus 1 KiB the hardware
// reserves per block), capped at 4:
//  - sm_90 (228 KiB per SM): 4 up to HSP = 64 (46 KiB each; 128 registers, 8 bytes spilled
//    and reloaded only outside the key loop), 2 at HSP = 128 (86 KiB each).
//  - sm_80 (164 KiB per SM): 3 at HSP = 64, where asking for 4 would cap registers at 128
//    for nothing and spill inside the key loop (ptxas, CUDA 13: 40 bytes); 4 below, 2 at 128.
template <int HSP>
constexpr int mma_forward_min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return HSP <= 32 ? 4 : HSP <= 64 ? 3 : 2;
#else
  return HSP <= 64 ? 4 : 2;
#endif
}

// Grid (query tiles, B * NH); as simt_forward_kernel (query head h with key/value head
// h / group), in the base-2 domain: scores are scaled by scale * log2(e) and exponentiated
// with exp2f.
template <int HSP>
__global__ void __launch_bounds__(kThreads, mma_forward_min_blocks<HSP>())
    mma_forward_kernel(Bf16* out, float* lse, const Bf16* qkv, Geometry g) {
  constexpr int S = HSP + 8;
  uint16_t* qs = reinterpret_cast<uint16_t*>(dynamic_smem());
  uint16_t* ks = qs + kTile * S;                                  // [2][kTile][S]
  uint16_t* vs = ks + 2 * kTile * S;                              // [2][kTile][S]
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest rows first
  const int q0 = tile * kTile;
  const int b = static_cast<int>(blockIdx.y) / g.NH, h = static_cast<int>(blockIdx.y) % g.NH;
  const size_t stride = qkv_width(g);
  const uint16_t* q_head = reinterpret_cast<const uint16_t*>(qkv) + q_offset(g, b, h);
  const uint16_t* k_head = reinterpret_cast<const uint16_t*>(qkv) + k_offset(g, b, h / g.group);
  const uint16_t* v_head = reinterpret_cast<const uint16_t*>(qkv) + v_offset(g, b, h / g.group);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * 16 + lane / 4;  // this thread's rows in the tile: row0, row0 + 8
  const int col0 = 2 * (lane % 4);        // and columns col0, col0 + 1 of each n-tile
  const float score_scale = g.scale * kLog2e;
  copy_rows_async<HSP, kTile>(qs, q_head, stride, q0, g.T, g.hs);
  copy_rows_async<HSP, kTile>(ks, k_head, stride, 0, g.T, g.hs);
  copy_rows_async<HSP, kTile>(vs, v_head, stride, 0, g.T, g.hs);
  cp_async_commit();

  float acc[HSP / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's 16 columns per tile; the quad sums at the end
  for (int kt = 0; kt <= tile; kt++) {
    const int buf = kt & 1;
    if (kt < tile) {
      const int next = (buf ^ 1) * kTile * S;
      copy_rows_async<HSP, kTile>(ks + next, k_head, stride, (kt + 1) * kTile, g.T, g.hs);
      copy_rows_async<HSP, kTile>(vs + next, v_head, stride, (kt + 1) * kTile, g.T, g.hs);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* kb = ks + buf * kTile * S;
    const uint16_t* vb = vs + buf * kTile * S;
    float s[kTile / 8][4] = {};
    warp_mma_abt<kTile / 8, HSP / 16>(s, qs + warp * 16 * S, kb, S, lane);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kTile / 8; nt++) {
#pragma unroll
      for (int c = 0; c < 4; c++) {
        // Causal: on the diagonal tile (k0 == q0) key column > row is masked. Row r keeps
        // key k0, so no row is ever fully masked.
        const bool masked = kt == tile && nt * 8 + col0 + (c & 1) > row0 + 8 * (c >> 1);
        s[nt][c] = masked ? -INFINITY : s[nt][c] * score_scale;
        tile_max[c >> 1] = fmaxf(tile_max[c >> 1], s[nt][c]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      // A row's 64 scores are spread over the 4 threads of a quad (lanes 4 g .. 4 g + 3).
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullMask, tile_max[r], 2));
      const float new_max = fmaxf(row_max[r], tile_max[r]);
      const float correction = exp2f(row_max[r] - new_max);  // 0 on the first tile
      row_max[r] = new_max;
      row_sum[r] *= correction;
#pragma unroll
      for (int dn = 0; dn < HSP / 8; dn++) {
        acc[dn][2 * r] *= correction;
        acc[dn][2 * r + 1] *= correction;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kTile / 8; nt++) {
#pragma unroll
      for (int c = 0; c < 4; c++) {
        s[nt][c] = exp2f(s[nt][c] - row_max[c >> 1]);
        row_sum[c >> 1] += s[nt][c];
      }
    }
    warp_mma_pb<kTile / 16, HSP / 8>(acc, s, vb, S, lane);  // acc += p v
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float total = row_sum[r];
    total += __shfl_xor_sync(kFullMask, total, 1);
    total += __shfl_xor_sync(kFullMask, total, 2);
    const int t = q0 + row0 + 8 * r;
    if (t >= g.T) continue;
    Bf16* o = out + (static_cast<size_t>(b) * g.T + t) * g.C + static_cast<size_t>(h) * g.hs;
#pragma unroll
    for (int dn = 0; dn < HSP / 8; dn++) {
      const int d = dn * 8 + col0;
      if (d < g.hs) store_bf16x2(o + d, acc[dn][2 * r] / total, acc[dn][2 * r + 1] / total);
    }
    // row_max is in log2 units: lse = ln(2^m total) = m ln 2 + ln(total).
    if (lane % 4 == 0) lse[stat_index(g, b, h, t)] = row_max[r] * kLn2 + logf(total);
  }
}

// Grid (key tiles, key/value heads of the chunk from unit0 on): dk and dv of one key tile of
// key/value head (b, kvh), over its group's query heads in order and, for each, the queries
// from the diagonal on, kStep at a time; and the dS^T tiles (without the scale) of those
// tile pairs into ds. The steps run on through the group's heads as one double-buffered
// sequence (the last step of a head prefetches the next head's first), and dk, dv sum the
// heads in registers, in order. Each warp owns 16 keys: s^T = k q^T and dP^T = v dout^T are
// its C fragments (rows keys, columns queries), and dv += P^T dout, dk += dS^T q reuse them
// as A fragments.
template <int HSP>
__global__ void __launch_bounds__(kThreads)
    mma_backward_dkv_kernel(Bf16* dqkv, Bf16* ds, const Bf16* dout, const Bf16* qkv,
                            const float* lse, const float* delta, Geometry g, int unit0) {
  constexpr int S = HSP + 8;
  constexpr int kStep = mma_backward_step<HSP>();
  uint16_t* ks = reinterpret_cast<uint16_t*>(dynamic_smem());
  uint16_t* vs = ks + kTile * S;
  uint16_t* qs = vs + kTile * S;                                 // [2][kStep][S]
  uint16_t* dos = qs + 2 * kStep * S;                            // [2][kStep][S]
  float* lse_s = reinterpret_cast<float*>(dos + 2 * kStep * S);  // [2][kStep]
  float* delta_s = lse_s + 2 * kStep;                            // [2][kStep]
  const int k0 = static_cast<int>(blockIdx.x) * kTile;           // key tile 0 (the most work) first
  const int unit = unit0 + static_cast<int>(blockIdx.y), b = unit / g.KVH, kvh = unit % g.KVH;
  const size_t stride = qkv_width(g);
  // The group's query heads are consecutive: each one's q and dout columns follow the
  // previous one's by hs, its lse and D rows by T. These point at the current head's.
  const int h0 = kvh * g.group;
  const uint16_t* q_head = reinterpret_cast<const uint16_t*>(qkv) + q_offset(g, b, h0);
  const uint16_t* dout_head = reinterpret_cast<const uint16_t*>(dout) + head_offset(g, b, h0, g.C);
  const float* lse_head = lse + stat_index(g, b, h0, 0);
  const float* delta_head = delta + stat_index(g, b, h0, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * 16 + lane / 4;  // this thread's keys in the tile: row0, row0 + 8
  const int col0 = 2 * (lane % 4);        // and query columns col0, col0 + 1 of each n-tile
  const float score_scale = g.scale * kLog2e;
  const int kt = static_cast<int>(blockIdx.x);
  copy_rows_async<HSP, kTile>(ks, reinterpret_cast<const uint16_t*>(qkv) + k_offset(g, b, kvh),
                              stride, k0, g.T, g.hs);
  copy_rows_async<HSP, kTile>(vs, reinterpret_cast<const uint16_t*>(qkv) + v_offset(g, b, kvh),
                              stride, k0, g.T, g.hs);
  copy_rows_async<HSP, kStep>(qs, q_head, stride, k0, g.T, g.hs);
  copy_rows_async<HSP, kStep>(dos, dout_head, g.C, k0, g.T, g.hs);
  copy_stats_async(lse_s, lse_head, k0, kStep, g.T);
  copy_stats_async(delta_s, delta_head, k0, kStep, g.T);
  cp_async_commit();

  float dk[HSP / 8][4] = {}, dv[HSP / 8][4] = {};
  int step = 0;
  for (int r = 0; r < g.group; r++) {
    // This thread's first dS^T elements of the head: tile pair (the diagonal tile, this key
    // tile).
    Bf16* ds_pair = ds + ds_tile_offset(g, static_cast<int>(blockIdx.y) * g.group + r, kt, kt) +
                    row0 * kTile + col0;
    for (int q0 = k0; q0 < g.T; q0 += kStep, step++) {
      const int buf = step & 1;
      // The next step: this head's next queries, or the next head's first ones.
      const bool same_head = q0 + kStep < g.T;
      if (same_head || r + 1 < g.group) {
        const int next = buf ^ 1, next_q0 = same_head ? q0 + kStep : k0;
        const int columns = same_head ? 0 : g.hs, stats = same_head ? 0 : g.T;
        copy_rows_async<HSP, kStep>(qs + next * kStep * S, q_head + columns, stride, next_q0, g.T,
                                    g.hs);
        copy_rows_async<HSP, kStep>(dos + next * kStep * S, dout_head + columns, g.C, next_q0, g.T,
                                    g.hs);
        copy_stats_async(lse_s + next * kStep, lse_head + stats, next_q0, kStep, g.T);
        copy_stats_async(delta_s + next * kStep, delta_head + stats, next_q0, kStep, g.T);
      }
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const uint16_t* qb = qs + buf * kStep * S;
      const uint16_t* dob = dos + buf * kStep * S;
      const float* lse_b = lse_s + buf * kStep;
      const float* delta_b = delta_s + buf * kStep;
      float pt[kStep / 8][4] = {}, dst[kStep / 8][4] = {};
      warp_mma_abt<kStep / 8, HSP / 16>(pt, ks + warp * 16 * S, qb, S, lane);    // s^T
      warp_mma_abt<kStep / 8, HSP / 16>(dst, vs + warp * 16 * S, dob, S, lane);  // dP^T
      // Masks are needed only near the diagonal and past T.
      const bool edge = q0 < k0 + kTile || q0 + kStep > g.T;
#pragma unroll
      for (int nt = 0; nt < kStep / 8; nt++) {
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int col = nt * 8 + col0 + (c & 1), t = q0 + col, key = k0 + row0 + 8 * (c >> 1);
          float p = exp2f(pt[nt][c] * score_scale - lse_b[col] * kLog2e);
          if (edge && (t < key || t >= g.T)) p = 0.0f;
          pt[nt][c] = p;
          dst[nt][c] = p * (dst[nt][c] - delta_b[col]);  // dS^T, without the scale
        }
      }
      warp_mma_pb<kStep / 16, HSP / 8>(dv, pt, dob, S, lane);  // dv += P^T dout
      // dS^T for the dq pass, rounded to bf16 as the mma below rounds it: rows row0 and
      // row0 + 8 of the tile pair, this step's columns. Every element is stored (zeros past
      // T included): the dq pass reads whole tiles. ds_pair points at the current tile pair;
      // stepping it (rather than recomputing it from q0) keeps ptxas from spilling here.
      Bf16* ds_step = ds_pair + q0 % kTile;
#pragma unroll
      for (int nt = 0; nt < kStep / 8; nt++) {
        store_bf16x2(ds_step + nt * 8, dst[nt][0], dst[nt][1]);
        store_bf16x2(ds_step + 8 * kTile + nt * 8, dst[nt][2], dst[nt][3]);
      }
      warp_mma_pb<kStep / 16, HSP / 8>(dk, dst, qb, S, lane);  // dk += dS^T q
      // Pair (i + 1, j) follows pair (i, j) by i + 1 tiles.
      if ((q0 + kStep) % kTile == 0) ds_pair += static_cast<size_t>(q0 / kTile + 1) * kTile * kTile;
      __syncthreads();
    }
    q_head += g.hs;
    dout_head += g.hs;
    lse_head += g.T;
    delta_head += g.T;
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = k0 + row0 + 8 * r;
    if (key >= g.T) continue;
    Bf16* dk_row = dqkv + k_offset(g, b, kvh) + static_cast<size_t>(key) * stride;
    Bf16* dv_row = dqkv + v_offset(g, b, kvh) + static_cast<size_t>(key) * stride;
#pragma unroll
    for (int dn = 0; dn < HSP / 8; dn++) {
      const int d = dn * 8 + col0;
      if (d >= g.hs) continue;
      store_bf16x2(dk_row + d, dk[dn][2 * r] * g.scale, dk[dn][2 * r + 1] * g.scale);
      store_bf16x2(dv_row + d, dv[dn][2 * r], dv[dn][2 * r + 1]);
    }
  }
}

// Grid (query tiles, query heads of the chunk from bh0 on): dq = dS k of one query tile over
// key tiles 0..tile (of the head's key/value head), from the dS^T tiles that
// mma_backward_dkv_kernel stored (without the scale). Each warp owns 16 queries; a dS^T tile
// and a k tile per step, double-buffered.
template <int HSP>
__global__ void __launch_bounds__(kThreads)
    mma_backward_dq_kernel(Bf16* dqkv, const Bf16* ds, const Bf16* qkv, Geometry g, int bh0) {
  constexpr int S = HSP + 8;
  constexpr int SD = kTile + 8;  // dS^T rows: 64 queries, padded as the other tiles
  uint16_t* dss = reinterpret_cast<uint16_t*>(dynamic_smem());    // [2][64 keys][SD]
  uint16_t* ks = dss + 2 * kTile * SD;                            // [2][64 keys][S]
  const int tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest rows first
  const int q0 = tile * kTile;
  const int bh = bh0 + static_cast<int>(blockIdx.y), b = bh / g.NH, h = bh % g.NH;
  const size_t stride = qkv_width(g);
  const uint16_t* k_head = reinterpret_cast<const uint16_t*>(qkv) + k_offset(g, b, h / g.group);
  // Tile pairs (tile, 0), (tile, 1), ..., (tile, tile) are consecutive.
  const uint16_t* ds_row = reinterpret_cast<const uint16_t*>(ds) +
                           ds_tile_offset(g, static_cast<int>(blockIdx.y), tile, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * 16 + lane / 4;  // this thread's queries in the tile: row0, row0 + 8
  const int col0 = 2 * (lane % 4);        // and columns col0, col0 + 1 of each 8-wide block
  copy_rows_async<kTile, kTile>(dss, ds_row, kTile, 0, kTile, kTile);
  copy_rows_async<HSP, kTile>(ks, k_head, stride, 0, g.T, g.hs);
  cp_async_commit();

  float dq[HSP / 8][4] = {};
  for (int kt = 0; kt <= tile; kt++) {
    const int buf = kt & 1;
    if (kt < tile) {
      const int next = buf ^ 1;
      copy_rows_async<kTile, kTile>(dss + next * kTile * SD,
                                    ds_row + static_cast<size_t>(kt + 1) * kTile * kTile, kTile, 0,
                                    kTile, kTile);
      copy_rows_async<HSP, kTile>(ks + next * kTile * S, k_head, stride, (kt + 1) * kTile, g.T,
                                  g.hs);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    // Keys past T add nothing: their dS^T rows are zero, and so are their k rows.
    warp_mma_atb<kTile / 16, HSP / 8>(dq, dss + buf * kTile * SD + warp * 16, SD,
                                      ks + buf * kTile * S, S, lane);  // dq += dS k
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = q0 + row0 + 8 * r;
    if (t >= g.T) continue;
    Bf16* row = dqkv + q_offset(g, b, h) + static_cast<size_t>(t) * stride;
#pragma unroll
    for (int dn = 0; dn < HSP / 8; dn++) {
      const int d = dn * 8 + col0;
      if (d < g.hs) store_bf16x2(row + d, dq[dn][2 * r] * g.scale, dq[dn][2 * r + 1] * g.scale);
    }
  }
}

// ======================================================================================
// Host side
// ======================================================================================

Geometry geometry(int B, int T, int C, int NH, int KVH) {
  TANDEM_CHECK(B >= 0 && T >= 0 && C > 0 && NH > 0 && KVH > 0, "flash attention: bad sizes B=", B,
               " T=", T, " C=", C, " NH=", NH, " KVH=", KVH);
  TANDEM_CHECK(C % NH == 0, "flash attention: n_embd ", C, " is not a multiple of n_head ", NH);
  TANDEM_CHECK(NH % KVH == 0, "flash attention: n_head ", NH, " is not a multiple of n_kv_head ",
               KVH, "; each key/value head serves a whole group of query heads");
  const int hs = C / NH;
  TANDEM_CHECK(hs <= kFlashMaxHeadSize, "flash attention supports head sizes up to ",
               kFlashMaxHeadSize, ", got ", hs, " (n_embd ", C, " / n_head ", NH,
               "); use more heads");
  // The grid is (tiles, B * NH): gridDim.y allows 65535.
  TANDEM_CHECK(static_cast<long long>(B) * NH <= 65535,
               "flash attention: batch x heads = ", static_cast<long long>(B) * NH,
               " is more than the 65535 the kernel grid allows; use a smaller micro-batch");
  return Geometry{B, T, C, NH, KVH, NH / KVH, hs, 1.0f / std::sqrt(static_cast<float>(hs))};
}

// Calls f(std::integral_constant<int, HSP>) for hs rounded up to a supported tile width.
template <typename F>
void with_head_tile(int hs, F&& f) {
  if (hs <= 16)
    f(std::integral_constant<int, 16>{});
  else if (hs <= 32)
    f(std::integral_constant<int, 32>{});
  else if (hs <= 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

// The tensor-core kernels copy 16-byte chunks: head columns start at multiples of 8 bf16
// and every tensor is 16-byte aligned.
bool tensor_core_ready(const Geometry& g, std::initializer_list<const void*> tensors) {
  if (g.hs % 8 != 0) return false;
  for (const void* p : tensors) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// x: the tiles of one head (fastest varying, so a head's blocks run together and its k, v
// tiles are reused from L2), y: `heads` (batch, head) pairs (query heads, or key/value heads
// for the dk/dv pass).
dim3 grid(const Geometry& g, int heads) {
  return dim3(static_cast<unsigned>((g.T + kTile - 1) / kTile), static_cast<unsigned>(heads));
}

// Where the backward scratch puts delta and the dS tiles (flash_attention.cuh). The passes
// run over chunks of key/value heads: a dk/dv block needs the dS tiles of its whole group.
struct BackwardScratch {
  size_t delta_bytes;     // delta [B, NH, T] fp32, padded to 256 bytes (dS stays aligned)
  size_t group_ds_bytes;  // one key/value head's group's dS^T tiles [NH/KVH][pairs][64][64] Elem
};
template <typename Elem>
BackwardScratch backward_scratch(const Geometry& g) {
  const size_t delta = sizeof(float) * static_cast<size_t>(g.B) * g.NH * g.T;
  return BackwardScratch{(delta + 255) / 256 * 256,
                         sizeof(Elem) * g.group * tile_pairs(g.T) * kTile * kTile};
}

}  // namespace

template <typename Elem>
void flash_attention_forward(Elem* out, float* lse, const Elem* qkv, int B, int T, int C, int NH,
                             int KVH, cudaStream_t stream) {
  const Geometry g = geometry(B, T, C, NH, KVH);
  if (B == 0 || T == 0) return;
  if constexpr (std::is_same_v<Elem, Bf16>) {
    if (tensor_core_ready(g, {out, qkv})) {
      with_head_tile(g.hs, [&](auto tile) {
        constexpr int HSP = decltype(tile)::value;
        launch(mma_forward_kernel<HSP>, grid(g, g.B * g.NH), mma_forward_smem<HSP>(), stream,
               "flash_attention_forward", out, lse, qkv, g);
      });
      return;
    }
  }
  with_head_tile(g.hs, [&](auto tile) {
    constexpr int HSP = decltype(tile)::value;
    launch(simt_forward_kernel<Elem, HSP>, grid(g, g.B * g.NH), simt_forward_smem<HSP>(), stream,
           "flash_attention_forward", out, lse, qkv, g);
  });
}

template <typename Elem>
size_t flash_attention_backward_scratch_bytes(int B, int T, int C, int NH, int KVH) {
  const Geometry g = geometry(B, T, C, NH, KVH);
  if (B == 0 || T == 0) return 0;
  const BackwardScratch s = backward_scratch<Elem>(g);
  const size_t groups =
      std::min(static_cast<size_t>(g.B) * g.KVH,
               std::max<size_t>(1, kFlashBackwardScratchBudget / s.group_ds_bytes));
  return s.delta_bytes + groups * s.group_ds_bytes;
}

template <typename Elem>
size_t flash_attention_backward_min_scratch_bytes(int B, int T, int C, int NH, int KVH) {
  const Geometry g = geometry(B, T, C, NH, KVH);
  if (B == 0 || T == 0) return 0;
  const BackwardScratch s = backward_scratch<Elem>(g);
  return s.delta_bytes + s.group_ds_bytes;
}

template <typename Elem>
void flash_attention_backward(Elem* dqkv, void* scratch, size_t scratch_bytes, const Elem* dout,
                              const Elem* qkv, const Elem* out, const float* lse, int B, int T,
                              int C, int NH, int KVH, cudaStream_t stream) {
  const Geometry g = geometry(B, T, C, NH, KVH);
  if (B == 0 || T == 0) return;
  const BackwardScratch layout = backward_scratch<Elem>(g);
  TANDEM_CHECK(scratch_bytes >= layout.delta_bytes + layout.group_ds_bytes,
               "flash attention backward: ", scratch_bytes, " bytes of scratch, less than the ",
               layout.delta_bytes + layout.group_ds_bytes,
               " of flash_attention_backward_min_scratch_bytes");
  float* delta = static_cast<float*>(scratch);
  Elem* ds = reinterpret_cast<Elem*>(static_cast<char*>(scratch) + layout.delta_bytes);
  // Chunks of equal size (but the last), as many key/value heads (with their groups of query
  // heads) each as the scratch holds. A chunk of key/value heads [u0, u0 + n) is the query
  // heads [u0 group, (u0 + n) group): (b, kvh) = u serves (b, h) = u group + r.
  const int units = B * KVH;
  const int fit = static_cast<int>(
      std::min<size_t>(units, (scratch_bytes - layout.delta_bytes) / layout.group_ds_bytes));
  const int chunks = (units + fit - 1) / fit;
  const int chunk = (units + chunks - 1) / chunks;
  constexpr int kPackWidth = 16 / sizeof(Elem);
  const size_t packed_smem = delta_packed_smem(C, NH);
  if (g.hs % kPackWidth == 0 && packed_smem <= 96 * 1024 &&
      reinterpret_cast<uintptr_t>(dout) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const size_t rows = static_cast<size_t>(B) * T;  // a warp each
    launch(delta_packed_kernel<Elem>,
           dim3(static_cast<unsigned>((rows + kDeltaWarps - 1) / kDeltaWarps)), packed_smem, stream,
           "flash_attention_backward (delta)", delta, dout, out, g);
  } else {
    const size_t rows = static_cast<size_t>(B) * T * NH;
    launch(delta_kernel<Elem>, dim3(static_cast<unsigned>((rows + kThreads - 1) / kThreads)), 0,
           stream, "flash_attention_backward (delta)", delta, dout, out, g);
  }
  const float* delta_in = delta;
  if constexpr (std::is_same_v<Elem, Bf16>) {
    if (tensor_core_ready(g, {dqkv, dout, qkv, ds})) {
      with_head_tile(g.hs, [&](auto tile) {
        constexpr int HSP = decltype(tile)::value;
        for (int u0 = 0; u0 < units; u0 += chunk) {
          const int n = std::min(chunk, units - u0);
          launch(mma_backward_dkv_kernel<HSP>, grid(g, n), mma_dkv_smem<HSP>(), stream,
                 "flash_attention_backward (dk, dv, dS)", dqkv, ds, dout, qkv, lse, delta_in, g,
                 u0);
          launch(mma_backward_dq_kernel<HSP>, grid(g, n * g.group), mma_dq_smem<HSP>(), stream,
                 "flash_attention_backward (dq)", dqkv, static_cast<const Bf16*>(ds), qkv, g,
                 u0 * g.group);
        }
      });
      return;
    }
  }
  with_head_tile(g.hs, [&](auto tile) {
    constexpr int HSP = decltype(tile)::value;
    for (int u0 = 0; u0 < units; u0 += chunk) {
      const int n = std::min(chunk, units - u0);
      launch(simt_backward_dkv_kernel<Elem, HSP>, grid(g, n), simt_dkv_smem<HSP>(), stream,
             "flash_attention_backward (dk, dv, dS)", dqkv, ds, dout, qkv, lse, delta_in, g, u0);
      launch(simt_backward_dq_kernel<Elem, HSP>, grid(g, n * g.group), simt_dq_smem<HSP>(), stream,
             "flash_attention_backward (dq)", dqkv, static_cast<const Elem*>(ds), qkv, g,
             u0 * g.group);
    }
  });
}

template size_t flash_attention_backward_scratch_bytes<float>(int, int, int, int, int);
template size_t flash_attention_backward_scratch_bytes<Bf16>(int, int, int, int, int);
template size_t flash_attention_backward_min_scratch_bytes<float>(int, int, int, int, int);
template size_t flash_attention_backward_min_scratch_bytes<Bf16>(int, int, int, int, int);
template void flash_attention_forward<float>(float*, float*, const float*, int, int, int, int, int,
                                             cudaStream_t);
template void flash_attention_forward<Bf16>(Bf16*, float*, const Bf16*, int, int, int, int, int,
                                            cudaStream_t);
template void flash_attention_backward<float>(float*, void*, size_t, const float*, const float*,
                                              const float*, const float*, int, int, int, int, int,
                                              cudaStream_t);
template void flash_attention_backward<Bf16>(Bf16*, void*, size_t, const Bf16*, const Bf16*,
                                             const Bf16*, const float*, int, int, int, int, int,
                                             cudaStream_t);

}  // namespace tandem::cuda
