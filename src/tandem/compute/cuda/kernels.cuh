// CUDA kernels behind CudaBackend (fp32); see compute_backend.h for each contract.
// Deterministic: every output element is produced by one thread (or one fixed
// reduction tree), never by atomics, so the same inputs give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                     int T, int C, cudaStream_t stream);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                      int T, int C, cudaStream_t stream);
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, cudaStream_t stream);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t stream);
void add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream);
// sum[C] += column sums of x[N, C]
void column_sums_accumulate(float* sum, const float* x, int N, int C, cudaStream_t stream);
void gelu_forward(float* out, const float* inp, size_t N, cudaStream_t stream);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N, cudaStream_t stream);
void residual_forward(float* out, const float* a, const float* b, size_t N, cudaStream_t stream);
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                           cudaStream_t stream);
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            float dloss, int N, int V, cudaStream_t stream);
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream);
// scratch: B*NH*T floats.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int C, int NH,
                        cudaStream_t stream);
// partial[i] = sum of squares of x[i*block, (i+1)*block) in double, for
// ceil(n / block) blocks; the caller sums them in order.
void sum_of_squares_blocks(double* partial, const float* x, size_t n, size_t block,
                           cudaStream_t stream);

// Throws tandem::Error naming the kernel if its launch failed.
void check_launch(const char* kernel);

}  // namespace tandem::cuda
