// Compiled with -fmad=false (CMakeLists.txt): no contracted multiply-adds; every fma below
// is an explicit fmaf, where the CPU code calls std::fma, so each element goes through the
// CPU's IEEE operations (demo.cc, demo_transform.cc, demo_simd.h).
//
// Layout. Every intermediate (Y, Z, the kept or decoded coefficients, the first inverse
// stage) lives in scratch at the position of the tensor element it belongs to: coefficient
// (k, l) of the block at origin o is at o + k * cols + l. So each stage is one thread per
// tensor element, and no stage needs to know how the blocks are numbered except top-k and
// the decode, which run one thread block per DCT block.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/optim/demo/demo_cuda.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxGrid = 4096;

struct Geometry {
  int64_t rows, cols, cm, cn;
  const float* c_m;  // [cm, cm]
  const float* c_n;  // [cn, cn]
};

// Where element e's block starts, and e's row a and column b within it.
__device__ __forceinline__ int64_t block_origin(const Geometry& g, int64_t e, int64_t& a,
                                                int64_t& b) {
  const int64_t row = e / g.cols, col = e % g.cols;
  a = row % g.cm;
  b = col % g.cn;
  return e - a * g.cols - b;
}

// The origin of DCT block `block` (numbered row-major over the grid of blocks).
__device__ __forceinline__ int64_t origin_of_block(const Geometry& g, int64_t block) {
  const int64_t grid_cols = g.cols / g.cn;
  return (block / grid_cols) * g.cm * g.cols + (block % grid_cols) * g.cn;
}

// Coefficient i (f_row * cn + f_col) of the block at `origin`, in tensor layout.
__device__ __forceinline__ int64_t coefficient_at(const Geometry& g, int64_t origin, int64_t i) {
  return origin + (i / g.cn) * g.cols + i % g.cn;
}

__device__ __forceinline__ float grad_at(const void* grads, bool bf16, int64_t i) {
  return bf16 ? bf16_to_float(static_cast<const uint16_t*>(grads)[i])
              : static_cast<const float*>(grads)[i];
}

#define TANDEM_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// 1-2: weight decay and momentum, lr inside (DemoTensor::compress's first loop).
__global__ void momentum_kernel(float* params, float* delta, const void* grads, bool bf16,
                                int64_t n, float decay, float beta, float lr, float grad_scale) {
  TANDEM_GRID_STRIDE(i, n) {
    params[i] = params[i] * decay;
    delta[i] = fmaf(beta, delta[i], lr * (grad_scale * grad_at(grads, bf16, i)));
  }
}

// Forward, along rows: Y[a][l] = sum over b of X[a][b] C_n[l][b].
__global__ void forward_rows_kernel(Geometry g, const float* x, float* y) {
  TANDEM_GRID_STRIDE(e, g.rows * g.cols) {
    int64_t a, l;
    const int64_t o = block_origin(g, e, a, l);
    const float* xa = x + o + a * g.cols;
    const float* cl = g.c_n + l * g.cn;
    float acc = 0.0f;
    for (int64_t b = 0; b < g.cn; b++) acc = fmaf(xa[b], cl[b], acc);
    y[e] = acc;
  }
}

// Forward, along columns: Z[k][l] = sum over a of C_m[k][a] Y[a][l].
__global__ void forward_cols_kernel(Geometry g, const float* y, float* z) {
  TANDEM_GRID_STRIDE(e, g.rows * g.cols) {
    int64_t k, l;
    const int64_t o = block_origin(g, e, k, l);
    const float* ck = g.c_m + k * g.cm;
    float acc = 0.0f;
    for (int64_t a = 0; a < g.cm; a++) acc = fmaf(ck[a], y[o + a * g.cols + l], acc);
    z[e] = acc;
  }
}

// Inverse, first stage, skipping zero coefficients: Y[k][b] = sum over l of Z[k][l] C_n[l][b].
__global__ void inverse_rows_kernel(Geometry g, const float* z, float* y) {
  TANDEM_GRID_STRIDE(e, g.rows * g.cols) {
    int64_t k, b;
    const int64_t o = block_origin(g, e, k, b);
    const float* zk = z + o + k * g.cols;
    float acc = 0.0f;
    for (int64_t l = 0; l < g.cn; l++) {
      const float c = zk[l];
      if (c == 0.0f) continue;
      acc = fmaf(c, g.c_n[l * g.cn + b], acc);
    }
    y[e] = acc;
  }
}

// Inverse, second stage, skipping zero terms: X[a][b] = sum over k of C_m[k][a] Y[k][b].
__device__ __forceinline__ float inverse_cols_at(const Geometry& g, const float* y, int64_t e) {
  int64_t a, b;
  const int64_t o = block_origin(g, e, a, b);
  float acc = 0.0f;
  for (int64_t k = 0; k < g.cm; k++) {
    const float yk = y[o + k * g.cols + b];
    if (yk == 0.0f) continue;
    acc = fmaf(g.c_m[k * g.cm + a], yk, acc);
  }
  return acc;
}

// 4: the error feedback, delta += -1 * IDCT(kept) (DemoTensor::compress: delta + -1 * x).
__global__ void feedback_kernel(Geometry g, const float* y, float* delta) {
  TANDEM_GRID_STRIDE(e, g.rows * g.cols) { delta[e] = delta[e] + -1.0f * inverse_cols_at(g, y, e); }
}

// 5: u = IDCT(Q), p -= lr * sign(u), and the 16-bit working copy.
__global__ void sign_step_kernel(Geometry g, const float* y, float lr, float* params, float* u,
                                 uint16_t* params16, bool fp16) {
  TANDEM_GRID_STRIDE(e, g.rows * g.cols) {
    const float x = inverse_cols_at(g, y, e);
    if (u != nullptr) u[e] = x;
    const float s = x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
    const float p = params[e] - lr * s;
    params[e] = p;
    if (params16 != nullptr) params16[e] = fp16 ? float_to_fp16(p) : float_to_bf16(p);
  }
}

// Whether (mag, index) comes before (best_mag, best_index): larger magnitude first, the
// lower index among equals (DemoTensor::compress's order).
__device__ __forceinline__ bool ranks_before(float mag, int64_t index, float best_mag,
                                             int64_t best_index) {
  return mag > best_mag || (mag == best_mag && index < best_index);
}

// 3: one thread block per DCT block: the topk largest |Z| one at a time into the message,
// and the kept coefficients (the others 0) into `kept`. `taken` marks the chosen.
__global__ void topk_kernel(Geometry g, const float* z, int64_t topk, float* kept, float* taken,
                            int32_t* indices, float* values) {
  __shared__ float best_mag[kThreads];
  __shared__ int64_t best_index[kThreads];
  const int64_t block = blockIdx.x;
  const int64_t o = origin_of_block(g, block);
  const int64_t bs = g.cm * g.cn;
  const int t = threadIdx.x;
  for (int64_t i = t; i < bs; i += blockDim.x) taken[coefficient_at(g, o, i)] = 0.0f;
  __syncthreads();
  for (int64_t j = 0; j < topk; j++) {
    float mine = -1.0f;
    int64_t mine_index = LLONG_MAX;
    for (int64_t i = t; i < bs; i += blockDim.x) {
      const int64_t at = coefficient_at(g, o, i);
      if (taken[at] != 0.0f) continue;
      const float mag = fabsf(z[at]);
      if (ranks_before(mag, i, mine, mine_index)) {
        mine = mag;
        mine_index = i;
      }
    }
    best_mag[t] = mine;
    best_index[t] = mine_index;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
      if (t < half &&
          ranks_before(best_mag[t + half], best_index[t + half], best_mag[t], best_index[t])) {
        best_mag[t] = best_mag[t + half];
        best_index[t] = best_index[t + half];
      }
      __syncthreads();
    }
    if (t == 0) {
      const int64_t i = best_index[0];
      const int64_t at = coefficient_at(g, o, i);
      indices[block * topk + j] = static_cast<int32_t>(i);
      values[block * topk + j] = z[at];
      taken[at] = 1.0f;
    }
    __syncthreads();
  }
  for (int64_t i = t; i < bs; i += blockDim.x) {
    const int64_t at = coefficient_at(g, o, i);
    kept[at] = taken[at] != 0.0f ? z[at] : 0.0f;
  }
}

// 5, the decode: one thread block per DCT block sums the values sent for each coefficient
// rank by rank (from +0), counting the senders, then divides by their number.
__global__ void decode_kernel(Geometry g, const int32_t* indices, const float* values, int world,
                              int64_t topk, float* q, float* senders) {
  const int64_t block = blockIdx.x;
  const int64_t o = origin_of_block(g, block);
  const int64_t bs = g.cm * g.cn;
  const int64_t per_rank = (g.rows / g.cm) * (g.cols / g.cn) * topk;
  const int t = threadIdx.x;
  for (int64_t i = t; i < bs; i += blockDim.x) {
    q[coefficient_at(g, o, i)] = 0.0f;
    senders[coefficient_at(g, o, i)] = 0.0f;
  }
  __syncthreads();
  for (int r = 0; r < world; r++) {
    // One rank's indices within a block are distinct: its threads touch distinct entries.
    for (int64_t j = t; j < topk; j += blockDim.x) {
      const int64_t m = r * per_rank + block * topk + j;
      const int64_t i = indices[m];
      if (i < 0 || i >= bs) continue;  // checked by the caller
      const int64_t at = coefficient_at(g, o, i);
      q[at] = q[at] + values[m];
      senders[at] = senders[at] + 1.0f;
    }
    __syncthreads();
  }
  for (int64_t i = t; i < bs; i += blockDim.x) {
    const int64_t at = coefficient_at(g, o, i);
    if (senders[at] > 1.0f) q[at] = q[at] / senders[at];
  }
}

Geometry geometry_of(const DemoCudaBlocks& b) {
  return {b.rows, b.cols, b.block_rows, b.block_cols, b.c_m, b.c_n};
}

unsigned grid_for(int64_t n) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 1 ? 1 : wanted > kMaxGrid ? kMaxGrid : wanted);
}

void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, kind, s);
  if (err != cudaSuccess) fail("DeMo: copying a message failed: ", cudaGetErrorString(err));
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail("DeMo ", what, " kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

void launch_demo_compress_cuda(const DemoCudaBlocks& blocks, const DemoCudaCompress& args,
                               void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const Geometry g = geometry_of(blocks);
  const int64_t n = blocks.num_elements();
  float* y = args.scratch;           // Y, then the kept coefficients
  float* z = args.scratch + n;       // Z
  float* y2 = args.scratch + 2 * n;  // top-k's marks, then the inverse's first stage
  const unsigned grid = grid_for(n);
  momentum_kernel<<<grid, kThreads, 0, s>>>(args.params, args.delta, args.grads,
                                            args.grad_dtype == GradDType::kBF16, n, args.decay,
                                            args.beta, args.lr, args.grad_scale);
  check_launch("momentum");
  forward_rows_kernel<<<grid, kThreads, 0, s>>>(g, args.delta, y);
  check_launch("DCT");
  forward_cols_kernel<<<grid, kThreads, 0, s>>>(g, y, z);
  check_launch("DCT");
  topk_kernel<<<static_cast<unsigned>(blocks.count()), kThreads, 0, s>>>(g, z, args.topk, y, y2,
                                                                         args.indices, args.values);
  check_launch("top-k");
  const size_t entries = static_cast<size_t>(blocks.count() * args.topk);
  if (args.host_indices != nullptr)
    copy(args.host_indices, args.indices, entries * sizeof(int32_t), cudaMemcpyDeviceToHost, s);
  if (args.host_values != nullptr)
    copy(args.host_values, args.values, entries * sizeof(float), cudaMemcpyDeviceToHost, s);
  inverse_rows_kernel<<<grid, kThreads, 0, s>>>(g, y, y2);
  check_launch("inverse DCT");
  feedback_kernel<<<grid, kThreads, 0, s>>>(g, y2, args.delta);
  check_launch("error feedback");
}

void launch_demo_apply_cuda(const DemoCudaBlocks& blocks, const DemoCudaApply& args, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const Geometry g = geometry_of(blocks);
  const int64_t n = blocks.num_elements();
  float* q = args.scratch;
  float* senders = args.scratch + n;
  float* y = args.scratch + 2 * n;
  const unsigned grid = grid_for(n);
  const size_t entries = static_cast<size_t>(args.world * blocks.count() * args.topk);
  if (args.host_indices != nullptr)
    copy(args.indices, args.host_indices, entries * sizeof(int32_t), cudaMemcpyHostToDevice, s);
  if (args.host_values != nullptr)
    copy(args.values, args.host_values, entries * sizeof(float), cudaMemcpyHostToDevice, s);
  decode_kernel<<<static_cast<unsigned>(blocks.count()), kThreads, 0, s>>>(
      g, args.indices, args.values, args.world, args.topk, q, senders);
  check_launch("decode");
  inverse_rows_kernel<<<grid, kThreads, 0, s>>>(g, q, y);
  check_launch("inverse DCT");
  sign_step_kernel<<<grid, kThreads, 0, s>>>(
      g, y, args.lr, args.params, args.u,
      args.params16_dtype == WorkingDType::kNone ? nullptr : static_cast<uint16_t*>(args.params16),
      args.params16_dtype == WorkingDType::kF16);
  check_launch("sign step");
}

}  // namespace tandem
