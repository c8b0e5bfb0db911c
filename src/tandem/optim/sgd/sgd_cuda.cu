// SGD with momentum on a GPU (optim/sgd/sgd.cc, the recipe's optimizer): the same fmas as
// its CPU kernel, element by element, so the device update is bit-identical to the CPU's.
// Compiled with -fmad=false (CMakeLists.txt, every optim/**/*.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/offload/update_types.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;

struct Scalars {
  float lr, momentum, weight_decay, grad_scale;
};

// Elements [begin, end) of the arrays, a grid-stride loop.
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(float* params, float* momentum, const void* grads, int grad_bf16, void* params16,
               int working, unsigned long long begin, unsigned long long end, int decay,
               Scalars s) {
  const size_t threads = static_cast<size_t>(blockDim.x) * gridDim.x;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = begin + thread; i < end; i += threads) {
    const float grad = grad_bf16 ? bf16_to_float(static_cast<const uint16_t*>(grads)[i])
                                 : static_cast<const float*>(grads)[i];
    float g = grad * s.grad_scale;
    if (decay) g = std::fma(s.weight_decay, params[i], g);
    const float buf = std::fma(s.momentum, momentum[i], g);
    const float p = std::fma(-s.lr, buf, params[i]);
    momentum[i] = buf;
    params[i] = p;
    if (working == 1) static_cast<uint16_t*>(params16)[i] = float_to_bf16(p);
    if (working == 2) static_cast<uint16_t*>(params16)[i] = float_to_fp16(p);
  }
}

}  // namespace

void launch_sgd_cuda(float* params, float* momentum, const void* grads, GradDType grad_dtype,
                     void* params16, WorkingDType params16_dtype, const UpdateSegment* segments,
                     size_t num_segments, float lr, float mu, float weight_decay, float grad_scale,
                     void* stream) {
  const int working = params16 == nullptr                     ? 0
                      : params16_dtype == WorkingDType::kF16  ? 2
                      : params16_dtype == WorkingDType::kBF16 ? 1
                                                              : 0;
  const Scalars s{lr, mu, weight_decay, grad_scale};
  for (size_t k = 0; k < num_segments; k++) {
    const UpdateSegment& segment = segments[k];
    if (segment.end <= segment.begin) continue;
    const size_t wanted = (segment.end - segment.begin + kThreads - 1) / kThreads;
    const unsigned blocks = static_cast<unsigned>(wanted < 4096 ? wanted : 4096);
    sgd_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        params, momentum, grads, grad_dtype == GradDType::kBF16 ? 1 : 0, params16, working,
        segment.begin, segment.end, segment.weight_decay ? 1 : 0, s);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) fail("SGD kernel launch failed: ", cudaGetErrorString(err));
  }
}

}  // namespace tandem
