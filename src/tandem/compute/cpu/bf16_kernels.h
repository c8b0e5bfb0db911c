// The CPU backend's kernels for Bf16 storage. Each widens its inputs to fp32, runs the
// fp32 kernel of cpu_kernels.h and rounds what it stores (to nearest even), so a result
// is rounded exactly once, when stored: the same storage semantics as the GPU's bf16
// kernels (whose fp32 arithmetic may differ in summation order only). Slow (a copy per
// call), and meant for that: testing the bf16 model without a GPU, and being the CPU
// counterpart the GPU's bf16 kernels are checked against.
//
// They overload the fp32 kernels of cpu_kernels.h under the same names, so code written
// for an element type (CpuBackend's kernels, the tests) calls cpu::<kernel> for either.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/core/half.h"

namespace tandem {
class ThreadPool;
}  // namespace tandem

namespace tandem::cpu {

double sum_of_squares(ThreadPool& pool, const Bf16* x, size_t n);
void sum_of_squares_blocks(ThreadPool& pool, const Bf16* x, size_t n, double* partials);

void encoder_forward(ThreadPool& pool, Bf16* out, const int32_t* tokens, const Bf16* wte,
                     const Bf16* wpe, int B, int T, int C);
void encoder_backward(ThreadPool& pool, Bf16* dwte, Bf16* dwpe, const Bf16* dout,
                      const int32_t* tokens, int B, int T, int C);

void layernorm_forward(ThreadPool& pool, Bf16* out, float* mean, float* rstd, const Bf16* inp,
                       const Bf16* weight, const Bf16* bias, int N, int C);
void layernorm_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout,
                        const Bf16* inp, const Bf16* weight, const float* mean, const float* rstd,
                        int N, int C);

void matmul_forward(ThreadPool& pool, Bf16* out, const Bf16* inp, const Bf16* weight,
                    const Bf16* bias, int N, int C, int OC);
void matmul_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, Bf16* dbias, const Bf16* dout,
                     const Bf16* inp, const Bf16* weight, int N, int C, int OC);

void rmsnorm_forward(ThreadPool& pool, Bf16* out, float* rstd, const Bf16* inp, const Bf16* weight,
                     float eps, int N, int C);
void rmsnorm_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, const Bf16* dout,
                      const Bf16* inp, const Bf16* weight, const float* rstd, int N, int C);
void head_rmsnorm_forward(ThreadPool& pool, Bf16* out, float* rstd, const Bf16* inp,
                          const Bf16* weight, float eps, int N, int H, int HS, int row_stride);
void head_rmsnorm_backward(ThreadPool& pool, Bf16* dinp, Bf16* dweight, const Bf16* dout,
                           const Bf16* inp, const Bf16* weight, const float* rstd, int N, int H,
                           int HS, int row_stride);

void attention_forward(ThreadPool& pool, Bf16* out, float* lse, const Bf16* qkv, int B, int T,
                       int NH, int KVH, int HS);
void attention_backward(ThreadPool& pool, Bf16* dqkv, const Bf16* dout, const Bf16* qkv,
                        const Bf16* out, const float* lse, int B, int T, int NH, int KVH, int HS);
void rope_forward(ThreadPool& pool, Bf16* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                  int HS);
void rope_backward(ThreadPool& pool, Bf16* dqkv, const float* cos_sin, int B, int T, int NH,
                   int KVH, int HS);

void swiglu_forward(ThreadPool& pool, Bf16* out, const Bf16* inp, int N, int I);
void swiglu_backward(ThreadPool& pool, Bf16* dinp, const Bf16* inp, const Bf16* dout, int N, int I);

void gelu_forward(ThreadPool& pool, Bf16* out, const Bf16* inp, size_t N);
void gelu_backward(ThreadPool& pool, Bf16* dinp, const Bf16* inp, const Bf16* dout, size_t N);
void residual_forward(ThreadPool& pool, Bf16* out, const Bf16* a, const Bf16* b, size_t N);

void cross_entropy_forward(ThreadPool& pool, float* losses, const Bf16* logits,
                           const int32_t* targets, int N, int V);
void cross_entropy_backward(ThreadPool& pool, Bf16* dlogits, const Bf16* logits,
                            const int32_t* targets, float dloss, int N, int V);

}  // namespace tandem::cpu
