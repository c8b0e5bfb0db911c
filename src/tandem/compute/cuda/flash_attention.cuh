// Causal multi-head attention on the GPU, flash-attention style: tiles of queries, keys
// and values staged in shared memory, an online softmax with fp32 accumulation; the
// forward pass stores no T x T matrix, only each row's log-sum-exp. The backward pass
// recomputes probabilities from it once, in the dK/dV pass, which also leaves dS in scratch
// memory for the dQ pass (below). Deterministic: every output element has exactly one
// writer (no atomics) and every sum a fixed order, so the same inputs give the same bits.
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

// The backward pass's device scratch (256-byte aligned, as cudaMalloc's):
//   delta  [B, NH, T] fp32: D = rowsum(dout * out), padded to a multiple of 256 bytes;
//   dS     [heads][pairs][64 keys][64 queries] Elem: the key-by-query transpose of
//          dS = P (dP - D) (bf16 on the tensor-core path, Elem on the SIMT path) for every
//          64 x 64 tile pair (query tile i, key tile j <= i), pair index i (i + 1) / 2 + j,
//          of `heads` (batch, head) pairs at a time.
// The dK/dV pass writes dS, the dQ pass reads it (dQ = dS K), so dQ recomputes neither
// Q K^T nor dout V^T. It is about T^2 / 2 Elem per (batch, head): 1.06 MiB at T = 1024 in
// bf16. heads is all B * NH pairs if they fit in kFlashBackwardScratchBudget, otherwise as
// many as fit (at least one) and the passes run in chunks of heads.
inline constexpr size_t kFlashBackwardScratchBudget = size_t{256} << 20;

// Bytes of scratch flash_attention_backward<Elem> wants for these sizes: delta and the dS
// tiles of as many heads as the budget allows (all of them for GPT-2 small at B = 16,
// T = 1024 in bf16: 205 MiB).
template <typename Elem>
size_t flash_attention_backward_scratch_bytes(int B, int T, int C, int NH);

// The least scratch flash_attention_backward<Elem> runs with: delta and one head's dS.
template <typename Elem>
size_t flash_attention_backward_min_scratch_bytes(int B, int T, int C, int NH);

// dqkv[B,T,3C] (overwritten) from dout[B,T,C], given the forward's qkv, out and lse.
// scratch: scratch_bytes >= flash_attention_backward_min_scratch_bytes<Elem>(B, T, C, NH)
// bytes of 256-byte aligned device memory; the more heads' dS it holds (up to
// flash_attention_backward_scratch_bytes), the fewer launches. The result does not depend
// on scratch_bytes.
template <typename Elem>
void flash_attention_backward(Elem* dqkv, void* scratch, size_t scratch_bytes, const Elem* dout,
                              const Elem* qkv, const Elem* out, const float* lse, int B, int T,
                              int C, int NH, cudaStream_t stream);

}  // namespace tandem::cuda
