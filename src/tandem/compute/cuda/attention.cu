// Causal attention on the GPU without a stored T x T matrix: the forward pass runs an
// online softmax per query row and saves its log-sum-exp; the backward pass recomputes
// probabilities from it. One thread per query row (forward, dq) or key row (dk, dv), so
// every output has exactly one writer and the result is deterministic. This is the
// straightforward version the tiled (shared-memory) kernel must match.
#include <cmath>

#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/core/error.h"

namespace tandem::cuda {
namespace {

constexpr int kMaxHeadSize = 128;
constexpr int kThreads = 128;

struct Geometry {
  int B, T, C, NH, hs;
  float scale;
  __device__ size_t row(int b, int t) const { return (static_cast<size_t>(b) * T + t); }
  __device__ const float* q(const float* qkv, int b, int t, int h) const {
    return qkv + row(b, t) * 3 * C + h * hs;
  }
  __device__ const float* k(const float* qkv, int b, int t, int h) const {
    return q(qkv, b, t, h) + C;
  }
  __device__ const float* v(const float* qkv, int b, int t, int h) const {
    return q(qkv, b, t, h) + 2 * C;
  }
  __device__ size_t stat(int b, int h, int t) const {  // index into [B, NH, T]
    return (static_cast<size_t>(b) * NH + h) * T + t;
  }
};

__device__ float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; i++) sum += a[i] * b[i];
  return sum;
}

__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, Geometry g) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;  // over B * NH * T
  if (index >= g.B * g.NH * g.T) return;
  const int t = index % g.T, h = (index / g.T) % g.NH, b = index / (g.T * g.NH);
  const float* q = g.q(qkv, b, t, h);
  float acc[kMaxHeadSize];
  for (int i = 0; i < g.hs; i++) acc[i] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) {
    const float score = dot(q, g.k(qkv, b, t2, h), g.hs) * g.scale;
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max);
    const float weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
    const float* v = g.v(qkv, b, t2, h);
    for (int i = 0; i < g.hs; i++) acc[i] = acc[i] * correction + weight * v[i];
    running_max = new_max;
  }
  float* o = out + g.row(b, t) * g.C + h * g.hs;
  for (int i = 0; i < g.hs; i++) o[i] = acc[i] / running_sum;
  lse[g.stat(b, h, t)] = running_max + logf(running_sum);
}

// D[b, h, t] = dout . out over the head: sum_t2 p * dp, formed cheaply.
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* out,
                                       Geometry g) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= g.B * g.NH * g.T) return;
  const int t = index % g.T, h = (index / g.T) % g.NH, b = index / (g.T * g.NH);
  const size_t offset = g.row(b, t) * g.C + h * g.hs;
  delta[g.stat(b, h, t)] = dot(dout + offset, out + offset, g.hs);
}

__global__ void attention_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv,
                                             const float* lse, const float* delta, Geometry g) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= g.B * g.NH * g.T) return;
  const int t = index % g.T, h = (index / g.T) % g.NH, b = index / (g.T * g.NH);
  const float* q = g.q(qkv, b, t, h);
  const float* d_o = dout + g.row(b, t) * g.C + h * g.hs;
  const float row_lse = lse[g.stat(b, h, t)], row_delta = delta[g.stat(b, h, t)];
  float dq[kMaxHeadSize];
  for (int i = 0; i < g.hs; i++) dq[i] = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) {
    const float* k = g.k(qkv, b, t2, h);
    const float p = expf(dot(q, k, g.hs) * g.scale - row_lse);
    const float dscore = p * (dot(d_o, g.v(qkv, b, t2, h), g.hs) - row_delta) * g.scale;
    for (int i = 0; i < g.hs; i++) dq[i] += dscore * k[i];
  }
  float* out = dqkv + g.row(b, t) * 3 * g.C + h * g.hs;
  for (int i = 0; i < g.hs; i++) out[i] = dq[i];
}

__global__ void attention_backward_dkv_kernel(float* dqkv, const float* dout, const float* qkv,
                                              const float* lse, const float* delta, Geometry g) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= g.B * g.NH * g.T) return;
  const int t2 = index % g.T, h = (index / g.T) % g.NH, b = index / (g.T * g.NH);
  const float* k = g.k(qkv, b, t2, h);
  const float* v = g.v(qkv, b, t2, h);
  float dk[kMaxHeadSize], dv[kMaxHeadSize];
  for (int i = 0; i < g.hs; i++) dk[i] = dv[i] = 0.0f;
  for (int t = t2; t < g.T; t++) {
    const float* q = g.q(qkv, b, t, h);
    const float* d_o = dout + g.row(b, t) * g.C + h * g.hs;
    const float p = expf(dot(q, k, g.hs) * g.scale - lse[g.stat(b, h, t)]);
    const float dscore = p * (dot(d_o, v, g.hs) - delta[g.stat(b, h, t)]) * g.scale;
    for (int i = 0; i < g.hs; i++) {
      dk[i] += dscore * q[i];
      dv[i] += p * d_o[i];
    }
  }
  float* row = dqkv + g.row(b, t2) * 3 * g.C + h * g.hs;
  for (int i = 0; i < g.hs; i++) {
    row[g.C + i] = dk[i];
    row[2 * g.C + i] = dv[i];
  }
}

Geometry geometry(int B, int T, int C, int NH) {
  const int hs = C / NH;
  TANDEM_CHECK(hs <= kMaxHeadSize, "CUDA attention supports head sizes up to ", kMaxHeadSize,
               ", got ", hs, " (model.n_embd / model.n_head); use more heads");
  return Geometry{B, T, C, NH, hs, 1.0f / sqrtf(static_cast<float>(hs))};
}

unsigned blocks(const Geometry& g) {
  return static_cast<unsigned>((static_cast<size_t>(g.B) * g.NH * g.T + kThreads - 1) / kThreads);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream) {
  const Geometry g = geometry(B, T, C, NH);
  attention_forward_kernel<<<blocks(g), kThreads, 0, stream>>>(out, lse, qkv, g);
  check_launch("attention_forward");
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int C, int NH,
                        cudaStream_t stream) {
  const Geometry g = geometry(B, T, C, NH);
  attention_delta_kernel<<<blocks(g), kThreads, 0, stream>>>(scratch, dout, out, g);
  attention_backward_dq_kernel<<<blocks(g), kThreads, 0, stream>>>(dqkv, dout, qkv, lse, scratch,
                                                                   g);
  attention_backward_dkv_kernel<<<blocks(g), kThreads, 0, stream>>>(dqkv, dout, qkv, lse, scratch,
                                                                    g);
  check_launch("attention_backward");
}

}  // namespace tandem::cuda
