// Causal multi-head attention on the GPU, flash-attention style: tiles of queries, keys
// and values staged in shared memory, an online softmax with fp32 accumulation, and
// never a stored T x T matrix. The forward pass saves each row's log-sum-exp; the
// backward pass recomputes probabilities from it. Deterministic: every output element
// has exactly one writer (no atomics), so the same inputs give the same bits.
//
// Layout (see ComputeBackend::attention_forward): qkv[B,T,3C] holds q, k, v as
// consecutive C-wide chunks; head h uses columns [h*hs, (h+1)*hs), hs = C / NH.
// Elem is float or Bf16 (storage); arithmetic is fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tandem/core/half.h"

namespace tandem::cuda {

// The largest head size the kernels support (GPT-2 uses 64).
inline constexpr int kFlashMaxHeadSize = 128;

// out[B,T,C] = softmax(q k^T / sqrt(hs) + causal mask) v per head; lse[B,NH,T] (fp32).
template <typename Elem>
void flash_attention_forward(Elem* out, float* lse, const Elem* qkv, int B, int T, int C, int NH,
                             cudaStream_t stream);

// Bytes of device scratch flash_attention_backward needs for these sizes.
size_t flash_attention_backward_scratch_bytes(int B, int T, int C, int NH);

// dqkv[B,T,3C] (overwritten) from dout[B,T,C], given the forward's qkv, out and lse.
// scratch: flash_attention_backward_scratch_bytes(B, T, C, NH) bytes of device memory.
template <typename Elem>
void flash_attention_backward(Elem* dqkv, void* scratch, const Elem* dout, const Elem* qkv,
                              const Elem* out, const float* lse, int B, int T, int C, int NH,
                              cudaStream_t stream);

}  // namespace tandem::cuda
