// DeMo's per-tensor work as CUDA kernels: DemoTensor::compress and DemoTensor::apply
// (demo.h) on device arrays, with the same IEEE operations in the same order, so a subgroup
// updated on the GPU holds the bits the CPU would give it:
//   - momentum: p * decay, fma(beta, delta, lr * (grad_scale * grad)), as on the CPU;
//   - the DCT and its inverse: one thread per output of each of the two stages, summing
//     from +0 in ascending index with one fma per term (demo_simd.h's combine_rows), the
//     inverse's first stage skipping zero coefficients and its second zero terms of Y;
//   - top-k: one thread block per DCT block picks the k largest |Z| one at a time, ties to
//     the lower index, so the indices come out in the CPU's order;
//   - the decode: one thread block per DCT block adds the ranks' values rank by rank, then
//     divides by the number of senders; the sign step and the 16-bit working copy.
// Declared without CUDA headers so that host code can call it; defined only in CUDA
// builds (TANDEM_HAVE_CUDA), compiled with -fmad=false like the AdamW kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

// One tensor's tiling (DemoBlocks) with its DCT matrices in device memory.
struct DemoCudaBlocks {
  int64_t rows = 1, cols = 1;              // rows 1 for a 1-D tensor
  int64_t block_rows = 1, block_cols = 1;  // the chunks
  const float* c_m = nullptr;              // [block_rows, block_rows], DemoBlocks::dct_rows()
  const float* c_n = nullptr;              // [block_cols, block_cols], DemoBlocks::dct_cols()

  int64_t num_elements() const { return rows * cols; }
  int64_t count() const { return (rows / block_rows) * (cols / block_cols); }
  int64_t block_size() const { return block_rows * block_cols; }
};

// Device scratch floats the kernels of one tensor need.
inline size_t demo_cuda_scratch_floats(const DemoCudaBlocks& blocks) {
  return 3 * static_cast<size_t>(blocks.num_elements());
}

struct DemoCudaCompress {
  float* params = nullptr;  // [num_elements], device
  float* delta = nullptr;
  const void* grads = nullptr;  // of grad_dtype
  GradDType grad_dtype = GradDType::kF32;
  float decay = 1.0f;  // 1 - lr * weight_decay, rounded as on the CPU
  float beta = 0.999f, lr = 0.0f, grad_scale = 1.0f;
  int64_t topk = 32;
  float* scratch = nullptr;    // demo_cuda_scratch_floats
  int32_t* indices = nullptr;  // [count * topk]: the message, block by block
  float* values = nullptr;
  // Optional (pinned) host copies of the message, written on the stream after it is made.
  int32_t* host_indices = nullptr;
  float* host_values = nullptr;
};

// Steps 1-4 of demo.h on `stream` (a cudaStream_t). Throws tandem::Error if a launch fails.
void launch_demo_compress_cuda(const DemoCudaBlocks& blocks, const DemoCudaCompress& args,
                               void* stream);

struct DemoCudaApply {
  // [world][count * topk], ranks in order: every rank's message (indices checked by the
  // caller to lie within a block).
  int32_t* indices = nullptr;
  float* values = nullptr;
  // Optional (pinned) host copies of them, copied into `indices` and `values` on the
  // stream first.
  const int32_t* host_indices = nullptr;
  const float* host_values = nullptr;
  int world = 1;
  int64_t topk = 32;
  float lr = 0.0f;
  float* params = nullptr;
  void* params16 = nullptr;  // optional 16-bit working copy
  WorkingDType params16_dtype = WorkingDType::kNone;
  float* scratch = nullptr;  // demo_cuda_scratch_floats
  float* u = nullptr;        // optional: the decoded update [num_elements]
};

// Step 5 of demo.h on `stream`.
void launch_demo_apply_cuda(const DemoCudaBlocks& blocks, const DemoCudaApply& args, void* stream);

}  // namespace tandem
