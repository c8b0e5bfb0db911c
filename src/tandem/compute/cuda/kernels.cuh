// CUDA kernels behind CudaBackend (see compute_backend.h for each contract), for tensors
// stored as Elem = float or Bf16. Every kernel loads with to_float, computes in fp32 and
// stores with from_float<Elem>, so a bf16 result is rounded once, when it is stored.
// LayerNorm and RMSNorm statistics, losses and the sum of squares are fp32 (double for the
// sum).
//
// Deterministic: every output element is produced by one thread in a fixed order, or by
// a reduction tree whose shape depends only on the sizes, never by atomics; so the same
// inputs give the same bits on every run. Kernels load 16 bytes per instruction (4
// floats or 8 bf16 values) where the pointers and row lengths allow it, and fall back to
// one element at a time otherwise.
//
// Kernels whose reductions need room (layernorm_backward, rmsnorm_backward,
// column_sums_accumulate, encoder_backward, sum_of_squares) take `scratch`: device memory
// of at least the matching *_scratch_bytes(...) bytes, used in stream order, so one buffer
// can serve them all.
//
// Attention is in flash_attention.cuh; matmuls are in cublaslt_matmul.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tandem/core/half.h"

namespace tandem::cuda {

// out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]; wpe null: no position embedding (Llama).
template <typename Elem>
void encoder_forward(Elem* out, const int32_t* tokens, const Elem* wte, const Elem* wpe, int B,
                     int T, int C, cudaStream_t stream);

size_t encoder_backward_scratch_bytes(int B, int T, int C);
// dwte[V,C] += scatter of dout[B,T,C] by token; dwpe[T,C] += sum over the batch (dwpe null:
// no position embedding). dwte is
// summed in the order of embedding_backward_order.h, as the CPU kernel does: the positions
// are sorted by token (a stable radix sort), fixed-size pieces of the sorted list are
// summed in parallel, and one block per token adds its pieces in order, so no two threads
// ever add to one row. scratch: encoder_backward_scratch_bytes(B, T, C) bytes.
template <typename Elem>
void encoder_backward(Elem* dwte, Elem* dwpe, const Elem* dout, const int32_t* tokens, int B, int T,
                      int C, void* scratch, cudaStream_t stream);

// out[N,C] = (inp - mean) * rstd * weight + bias per row; mean[N], rstd[N] (fp32).
template <typename Elem>
void layernorm_forward(Elem* out, float* mean, float* rstd, const Elem* inp, const Elem* weight,
                       const Elem* bias, int N, int C, cudaStream_t stream);

size_t layernorm_backward_scratch_bytes(int N, int C);
// dinp[N,C] += d(layernorm)/d(inp); dweight[C] += ; dbias[C] += .
template <typename Elem>
void layernorm_backward(Elem* dinp, Elem* dweight, Elem* dbias, const Elem* dout, const Elem* inp,
                        const Elem* weight, const float* mean, const float* rstd, int N, int C,
                        void* scratch, cudaStream_t stream);

// out[N,C] = inp * rstd * weight per row, rstd[N] = 1 / sqrt(mean(inp^2) + eps) (fp32).
template <typename Elem>
void rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps, int N,
                     int C, cudaStream_t stream);

size_t rmsnorm_backward_scratch_bytes(int N, int C);
// dinp[N,C] += d(rmsnorm)/d(inp); dweight[C] += (chunks of rows, then a fixed tree, as
// layernorm_backward's parameter gradients).
template <typename Elem>
void rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                      const Elem* weight, const float* rstd, int N, int C, void* scratch,
                      cudaStream_t stream);

// RMSNorm of each of H heads of HS columns in N rows of row_stride (Qwen3's q and k norms);
// rstd[N, H]; columns outside the heads untouched.
template <typename Elem>
void head_rmsnorm_forward(Elem* out, float* rstd, const Elem* inp, const Elem* weight, float eps,
                          int N, int H, int HS, int row_stride, cudaStream_t stream);

size_t head_rmsnorm_backward_scratch_bytes(int N, int H, int HS);
// dinp = d(head_rmsnorm)/d(inp) * dout, overwritten (dinp may be dout); dweight[HS] += .
template <typename Elem>
void head_rmsnorm_backward(Elem* dinp, Elem* dweight, const Elem* dout, const Elem* inp,
                           const Elem* weight, const float* rstd, int N, int H, int HS,
                           int row_stride, void* scratch, cudaStream_t stream);

// In place on the NH query and KVH key heads of qkv[B,T,(NH+2KVH)*HS] (the value heads
// untouched): (x[i], x[i + HS/2]) at position t turned by cos_sin[t, i, 0..1] ([T, HS/2, 2]
// fp32, device memory); rope_backward turns the gradients back.
template <typename Elem>
void rope_forward(Elem* qkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS,
                  cudaStream_t stream);
template <typename Elem>
void rope_backward(Elem* dqkv, const float* cos_sin, int B, int T, int NH, int KVH, int HS,
                   cudaStream_t stream);

// out[N,I] = silu(gate) * up for inp[N,2I] = [gate | up] per row.
template <typename Elem>
void swiglu_forward(Elem* out, const Elem* inp, int N, int I, cudaStream_t stream);
// dinp[N,2I] = [dout * up * silu'(gate) | dout * silu(gate)] (overwritten).
template <typename Elem>
void swiglu_backward(Elem* dinp, const Elem* inp, const Elem* dout, int N, int I,
                     cudaStream_t stream);

// out[n, :] = bias[:] for every row of out[N, OC]. With beta = 1 a GEMM then adds the
// product to it, rounding once: the bias path for when cuBLASLt's bias epilogue cannot be
// used.
template <typename Elem>
void broadcast_rows(Elem* out, const Elem* bias, int N, int OC, cudaStream_t stream);

size_t column_sums_scratch_bytes(int N, int C);
// sum[C] += column sums of x[N, C]
template <typename Elem>
void column_sums_accumulate(Elem* sum, const Elem* x, int N, int C, void* scratch,
                            cudaStream_t stream);

// out[N] = GELU(inp[N]), tanh approximation.
template <typename Elem>
void gelu_forward(Elem* out, const Elem* inp, size_t N, cudaStream_t stream);
// dinp[N] = GELU'(inp) * dout
template <typename Elem>
void gelu_backward(Elem* dinp, const Elem* inp, const Elem* dout, size_t N, cudaStream_t stream);
// out[N] = a[N] + b[N]
template <typename Elem>
void residual_forward(Elem* out, const Elem* a, const Elem* b, size_t N, cudaStream_t stream);

// losses[N] = logsumexp(logits[n, :]) - logits[n, targets[n]]; logits[N,V].
template <typename Elem>
void cross_entropy_forward(float* losses, const Elem* logits, const int32_t* targets, int N, int V,
                           cudaStream_t stream);
// dlogits[N,V] = dloss * (softmax(logits[n, :]) - onehot(targets[n]))
template <typename Elem>
void cross_entropy_backward(Elem* dlogits, const Elem* logits, const int32_t* targets, float dloss,
                            int N, int V, cudaStream_t stream);

size_t sum_of_squares_scratch_bytes(size_t n);
// *result (one double in device memory) = sum of x[i]^2 over x[n], in double: squares
// summed over fixed blocks of 16384 elements (sum_of_squares_blocks), then the block sums
// one after another in block order, as the CPU's sum_in_order adds them.
template <typename Elem>
void sum_of_squares(double* result, const Elem* x, size_t n, void* scratch, cudaStream_t stream);
// The first stage alone: partial[k] (device, ceil(n / 16384) doubles) = the sum of the
// squares of x[16384 k, 16384 (k + 1)). A piece of a buffer that starts on a block boundary
// gets the buffer's own block sums (ZeRO partitions).
template <typename Elem>
void sum_of_squares_blocks(double* partial, const Elem* x, size_t n, cudaStream_t stream);

// Throws tandem::Error naming the kernel if its launch failed.
void check_launch(const char* kernel);

}  // namespace tandem::cuda
