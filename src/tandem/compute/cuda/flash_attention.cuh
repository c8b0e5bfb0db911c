// Causal multi-head attention with grouped-query heads on the GPU, flash-attention style: tiles of
// queries, keys and values staged in shared memory, an online softmax with fp32 accumulation; the
// forward pass stores no T x T matrix, only each row's log-sum-exp. The backward pass
// recomputes probabilities from it once, in the dK/dV pass, which also leaves dS in scratch
// memory for the dQ pass (below). Deterministic: every output element has exactly one
// writer (no atomics) and every sum a fixed order, so the same inputs give the same bits.
//
// Layout (see ComputeBackend::attention_forward): qkv[B,T,(NH+2KVH)*hs] holds NH query
// heads, then KVH key heads, then KVH value heads, hs = C / NH columns each; query head h
// attends with key/value head h / (NH/KVH) (KVH divides NH; KVH = NH is GPT-2's multi-head
// attention, qkv[B,T,3C]). out and dout are [B,T,C], C = NH * hs. Elem is float or Bf16
// (storage); arithmetic is fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tandem/core/half.h"

namespace tandem::cuda {

// The largest head size the kernels support (GPT-2 uses 64).
inline constexpr int kFlashMaxHeadSize = 128;

// out[B,T,C] = softmax(q k^T / sqrt(hs) + causal mask) v per query head; lse[B,NH,T] (fp32).
template <typename Elem>
void flash_attention_forward(Elem* out, float* lse, const Elem* qkv, int B, int T, int C, int NH,
                             int KVH, cudaStream_t stream);

// The backward pass's device scratch (256-byte aligned, as cudaMalloc's):
//   delta  [B, NH, T] fp32: D = rowsum(dout * out), padded to a multiple of 256 bytes;
//   dS     [heads][pairs][64 keys][64 queries] Elem: the key-by-query transpose of
//          dS = P (dP - D) (bf16 on the tensor-core path, Elem on the SIMT path) for every
//          64 x 64 tile pair (query tile i, key tile j <= i), pair index i (i + 1) / 2 + j,
//          of `heads` (batch, query head) pairs at a time: the query heads of whole
//          key/value heads (NH/KVH each), since one block sums a key/value head's dK, dV.
// The dK/dV pass writes dS, the dQ pass reads it (dQ = dS K), so dQ recomputes neither
// Q K^T nor dout V^T. It is about T^2 / 2 Elem per (batch, query head): 1.06 MiB at
// T = 1024 in bf16. heads is all B * NH pairs if they fit in kFlashBackwardScratchBudget,
// otherwise the groups of as many key/value heads as fit (at least one) and the passes run
// in chunks of key/value heads.
inline constexpr size_t kFlashBackwardScratchBudget = size_t{256} << 20;

// Bytes of scratch flash_attention_backward<Elem> wants for these sizes: delta and the dS
// tiles of as many key/value heads' groups as the budget allows (all of them for GPT-2
// small at B = 16, T = 1024 in bf16: 205 MiB).
template <typename Elem>
size_t flash_attention_backward_scratch_bytes(int B, int T, int C, int NH, int KVH);

// The least scratch flash_attention_backward<Elem> runs with: delta and the dS of one
// key/value head's NH/KVH query heads.
template <typename Elem>
size_t flash_attention_backward_min_scratch_bytes(int B, int T, int C, int NH, int KVH);

// dqkv[B,T,(NH+2KVH)*hs] (overwritten) from dout[B,T,C], given the forward's qkv, out and
// lse; a key/value head's dK and dV sum its query heads' in head order.
// scratch: scratch_bytes >= flash_attention_backward_min_scratch_bytes<Elem>(B, T, C, NH,
// KVH) bytes of 256-byte aligned device memory; the more heads' dS it holds (up to
// flash_attention_backward_scratch_bytes), the fewer launches. The result does not depend
// on scratch_bytes.
template <typename Elem>
void flash_attention_backward(Elem* dqkv, void* scratch, size_t scratch_bytes, const Elem* dout,
                              const Elem* qkv, const Elem* out, const float* lse, int B, int T,
                              int C, int NH, int KVH, cudaStream_t stream);

}  // namespace tandem::cuda
