// CPU kernels behind CpuBackend; see compute_backend.h for each kernel's contract. Each
// shares its loop among the threads of `pool` (core/thread_pool.h), in chunks any thread
// may take. Deterministic on any thread count and any interleaving: a chunk computes the
// same whoever runs it, and every reduction runs in a fixed order that does not depend on
// how the work is divided.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {
class ThreadPool;
}  // namespace tandem

namespace tandem::cpu {

// Columns per work item of a column reduction: one 64-byte cache line of floats, so
// threads never share a line of the output.
inline constexpr int kColumnBlock = 16;

// Rows per chunk of a loop over rows: about kChunkFloats floats (64 KiB), at least one
// row, so that claiming a chunk costs little against computing it.
inline constexpr size_t kChunkFloats = 16384;
constexpr size_t rows_per_chunk(size_t row_floats) {
  return row_floats >= kChunkFloats ? 1 : kChunkFloats / (row_floats == 0 ? 1 : row_floats);
}

// sum of x[i]^2 in double, and its 16384-element block sums: compute/cpu/sum_of_squares.h's, whose
// order every backend keeps.
double sum_of_squares(ThreadPool& pool, const float* x, size_t n);
void sum_of_squares_blocks(ThreadPool& pool, const float* x, size_t n, double* partials);

void encoder_forward(ThreadPool& pool, float* out, const int32_t* tokens, const float* wte,
                     const float* wpe, int B, int T, int C);
void encoder_backward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout,
                      const int32_t* tokens, int B, int T, int C);

void layernorm_forward(ThreadPool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
void layernorm_backward(ThreadPool& pool, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C);

void matmul_forward(ThreadPool& pool, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC);
void matmul_backward(ThreadPool& pool, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC);

void rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp,
                     const float* weight, float eps, int N, int C);
void rmsnorm_backward(ThreadPool& pool, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, int N, int C);
void head_rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp,
                          const float* weight, float eps, int N, int H, int HS, int row_stride);
void head_rmsnorm_backward(ThreadPool& pool, float* dinp, float* dweight, const float* dout,
                           const float* inp, const float* weight, const float* rstd, int N, int H,
                           int HS, int row_stride);

void attention_forward(ThreadPool& pool, float* out, float* lse, const float* qkv, int B, int T,
                       int NH, int KVH, int HS);
void attention_backward(ThreadPool& pool, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int B, int T, int NH, int KVH, int HS);
void rope_forward(ThreadPool& pool, float* qkv, const float* cos_sin, int B, int T, int NH, int KVH,
                  int HS);
void rope_backward(ThreadPool& pool, float* dqkv, const float* cos_sin, int B, int T, int NH,
                   int KVH, int HS);

void swiglu_forward(ThreadPool& pool, float* out, const float* inp, int N, int I);
void swiglu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, int N,
                     int I);

void gelu_forward(ThreadPool& pool, float* out, const float* inp, size_t N);
void gelu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, size_t N);
void residual_forward(ThreadPool& pool, float* out, const float* a, const float* b, size_t N);

void cross_entropy_forward(ThreadPool& pool, float* losses, const float* logits,
                           const int32_t* targets, int N, int V);
void cross_entropy_backward(ThreadPool& pool, float* dlogits, const float* logits,
                            const int32_t* targets, float dloss, int N, int V);

// Adds the rows of x[N, C] into sum[C] (+=), column block by column block, rows in
// order: the result does not depend on the number of threads.
void column_sums_accumulate(ThreadPool& pool, float* sum, const float* x, int N, int C);

}  // namespace tandem::cpu
