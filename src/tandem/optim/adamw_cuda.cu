#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/optim/adamw_cuda.h"
#include "tandem/optim/adamw_math.h"

namespace tandem {
namespace {

// A grid-stride loop: consecutive threads touch consecutive elements, so every load
// and store is coalesced; one launch covers any n.
template <GradDType G, WorkingDType W>
__global__ void adamw_kernel(float* __restrict__ params, float* __restrict__ m,
                             float* __restrict__ v, const void* __restrict__ grads,
                             uint16_t* __restrict__ params16, size_t n, AdamWStepScalars s) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float grad;
    if constexpr (G == GradDType::kF32) {
      grad = static_cast<const float*>(grads)[i];
    } else {
      grad = bf16_to_float(static_cast<const uint16_t*>(grads)[i]);
    }
    const AdamWElement e = adamw_element(params[i], grad, m[i], v[i], s);
    params[i] = e.param;
    m[i] = e.m;
    v[i] = e.v;
    if constexpr (W == WorkingDType::kBF16) params16[i] = float_to_bf16(e.param);
    if constexpr (W == WorkingDType::kF16) params16[i] = float_to_fp16(e.param);
  }
}

template <GradDType G, WorkingDType W>
void launch(const AdamWArrays& a, size_t n, const AdamWStepScalars& s, cudaStream_t stream) {
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU several times over; the loop covers the rest.
  const size_t wanted = (n + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 8192 ? wanted : 8192);
  adamw_kernel<G, W><<<blocks, kThreads, 0, stream>>>(
      a.params, a.m, a.v, a.grads, static_cast<uint16_t*>(a.params16), n, s);
}

}  // namespace

void launch_adamw_cuda(const AdamWArrays& a, size_t n, const AdamWStepScalars& s, void* stream) {
  if (n == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const bool bf16_copy = a.params16 != nullptr && a.params16_dtype == WorkingDType::kBF16;
  const bool fp16_copy = a.params16 != nullptr && a.params16_dtype == WorkingDType::kF16;
  if (a.grad_dtype == GradDType::kF32) {
    if (bf16_copy) launch<GradDType::kF32, WorkingDType::kBF16>(a, n, s, cuda_stream);
    else if (fp16_copy) launch<GradDType::kF32, WorkingDType::kF16>(a, n, s, cuda_stream);
    else launch<GradDType::kF32, WorkingDType::kNone>(a, n, s, cuda_stream);
  } else {
    if (bf16_copy) launch<GradDType::kBF16, WorkingDType::kBF16>(a, n, s, cuda_stream);
    else if (fp16_copy) launch<GradDType::kBF16, WorkingDType::kF16>(a, n, s, cuda_stream);
    else launch<GradDType::kBF16, WorkingDType::kNone>(a, n, s, cuda_stream);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) fail("AdamW kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace tandem
