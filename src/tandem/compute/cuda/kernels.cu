// Elementwise, LayerNorm, cross-entropy and reduction kernels of the CUDA backend.
#include <cmath>

#include "tandem/compute/cuda/kernels.cuh"
#include "tandem/core/error.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Sum over a warp in a fixed butterfly order: the same bits every time.
__device__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Block-wide sum or max through shared memory (blockDim.x a multiple of 32, <= 1024).
template <bool kMax>
__device__ float block_reduce(float x) {
  __shared__ float warp_results[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = kMax ? warp_max(x) : warp_sum(x);
  __syncthreads();  // warp_results may still be read by a previous reduction
  if (lane == 0) warp_results[warp] = x;
  __syncthreads();
  x = lane < warps ? warp_results[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(x) : warp_sum(x);
}

__global__ void encoder_forward_kernel(float* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, int BT, int T, int C) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(BT) * C) return;
  const int bt = static_cast<int>(i / C), c = static_cast<int>(i % C);
  out[i] = wte[static_cast<size_t>(tokens[bt]) * C + c] + wpe[static_cast<size_t>(bt % T) * C + c];
}

// One thread per (t, c): the batch is summed in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= T * C) return;
  const int t = i / C, c = i % C;
  float sum = 0.0f;
  for (int b = 0; b < B; b++) sum += dout[(static_cast<size_t>(b) * T + t) * C + c];
  dwpe[i] += sum;
}

// One thread per channel, positions in order: repeated tokens add up in a fixed order.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* tokens,
                                            int BT, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int bt = 0; bt < BT; bt++)
    dwte[static_cast<size_t>(tokens[bt]) * C + c] += dout[static_cast<size_t>(bt) * C + c];
}

// One warp per row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += x[c];
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) var += (x[c] - m) * (x[c] - m);
  const float s = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
  float* o = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean,
                                                const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  const float* d = dout + static_cast<size_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dnorm = weight[c] * d[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * (x[c] - m) * s;
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
  float* di = dinp + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (x[c] - m) * s;
    di[c] += (weight[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// One thread per channel, rows in order.
__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const float* dout,
                                                 const float* inp, const float* mean,
                                                 const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int n = 0; n < N; n++) {
    const size_t i = static_cast<size_t>(n) * C + c;
    dw += (inp[i] - mean[n]) * rstd[n] * dout[i];
    db += dout[i];
  }
  dweight[c] += dw;
  dbias[c] += db;
}

__global__ void add_bias_kernel(float* out, const float* bias, int N, int OC) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < static_cast<size_t>(N) * OC) out[i] += bias[i % OC];
}

__global__ void column_sums_kernel(float* sum, const float* x, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int n = 0; n < N; n++) acc += x[static_cast<size_t>(n) * C + c];
  sum[c] += acc;
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t N) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t N) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float x = inp[i];
  const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
  const float sech_sq = 1.0f - th * th;
  const float grad =
      0.5f * (1.0f + th) + x * 0.5f * sech_sq * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = grad * dout[i];
}

__global__ void residual_kernel(float* out, const float* a, const float* b, size_t N) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) out[i] = a[i] + b[i];
}

// One block per row: log-sum-exp through two block reductions.
__device__ float row_logsumexp(const float* row, int V) {
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, row[v]);
  m = block_reduce<true>(m);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(row[v] - m);
  return m + logf(block_reduce<false>(sum));
}

__global__ void cross_entropy_forward_kernel(float* losses, const float* logits,
                                             const int32_t* targets, int V) {
  const float* row = logits + static_cast<size_t>(blockIdx.x) * V;
  const float lse = row_logsumexp(row, V);
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - row[targets[blockIdx.x]];
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits,
                                              const int32_t* targets, float dloss, int V) {
  const float* row = logits + static_cast<size_t>(blockIdx.x) * V;
  float* drow = dlogits + static_cast<size_t>(blockIdx.x) * V;
  const float lse = row_logsumexp(row, V);
  const int target = targets[blockIdx.x];
  for (int v = threadIdx.x; v < V; v += blockDim.x)
    drow[v] = dloss * expf(row[v] - lse) - (v == target ? dloss : 0.0f);
}

__global__ void sum_of_squares_kernel(double* partial, const float* x, size_t n, size_t block) {
  __shared__ double shared[kThreads];
  const size_t begin = static_cast<size_t>(blockIdx.x) * block;
  const size_t end = begin + block < n ? begin + block : n;
  double sum = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    sum += static_cast<double>(x[i]) * x[i];
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

}  // namespace

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    fail("CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorString(err));
}

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, cudaStream_t stream) {
  encoder_forward_kernel<<<blocks_for(static_cast<size_t>(B) * T * C), kThreads, 0, stream>>>(
      out, tokens, wte, wpe, B * T, T, C);
  check_launch("encoder_forward");
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, cudaStream_t stream) {
  encoder_backward_wpe_kernel<<<blocks_for(static_cast<size_t>(T) * C), kThreads, 0, stream>>>(
      dwpe, dout, B, T, C);
  encoder_backward_wte_kernel<<<blocks_for(C, 64), 64, 0, stream>>>(dwte, dout, tokens, B * T, C);
  check_launch("encoder_backward");
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream) {
  layernorm_forward_kernel<<<blocks_for(static_cast<size_t>(N) * 32), kThreads, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  check_launch("layernorm_forward");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t stream) {
  layernorm_backward_input_kernel<<<blocks_for(static_cast<size_t>(N) * 32), kThreads, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  layernorm_backward_params_kernel<<<blocks_for(C, 64), 64, 0, stream>>>(dweight, dbias, dout, inp,
                                                                         mean, rstd, N, C);
  check_launch("layernorm_backward");
}

void add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream) {
  add_bias_kernel<<<blocks_for(static_cast<size_t>(N) * OC), kThreads, 0, stream>>>(out, bias, N,
                                                                                    OC);
  check_launch("add_bias");
}

void column_sums_accumulate(float* sum, const float* x, int N, int C, cudaStream_t stream) {
  column_sums_kernel<<<blocks_for(C, 64), 64, 0, stream>>>(sum, x, N, C);
  check_launch("column_sums");
}

void gelu_forward(float* out, const float* inp, size_t N, cudaStream_t stream) {
  gelu_forward_kernel<<<blocks_for(N), kThreads, 0, stream>>>(out, inp, N);
  check_launch("gelu_forward");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N,
                   cudaStream_t stream) {
  gelu_backward_kernel<<<blocks_for(N), kThreads, 0, stream>>>(dinp, inp, dout, N);
  check_launch("gelu_backward");
}

void residual_forward(float* out, const float* a, const float* b, size_t N, cudaStream_t stream) {
  residual_kernel<<<blocks_for(N), kThreads, 0, stream>>>(out, a, b, N);
  check_launch("residual_forward");
}

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                           cudaStream_t stream) {
  cross_entropy_forward_kernel<<<N, kThreads, 0, stream>>>(losses, logits, targets, V);
  check_launch("cross_entropy_forward");
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            float dloss, int N, int V, cudaStream_t stream) {
  cross_entropy_backward_kernel<<<N, kThreads, 0, stream>>>(dlogits, logits, targets, dloss, V);
  check_launch("cross_entropy_backward");
}

void sum_of_squares_blocks(double* partial, const float* x, size_t n, size_t block,
                           cudaStream_t stream) {
  sum_of_squares_kernel<<<static_cast<unsigned>((n + block - 1) / block), kThreads, 0, stream>>>(
      partial, x, n, block);
  check_launch("sum_of_squares");
}

}  // namespace tandem::cuda
