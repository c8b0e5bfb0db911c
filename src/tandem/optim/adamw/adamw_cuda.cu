// Compiled with -fmad=false (CMakeLists.txt): no contracted multiply-adds, so every element
// goes through exactly adamw_element's IEEE operations, as on the CPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/core/error.h"
#include "tandem/core/half.h"
#include "tandem/optim/adamw/adamw_cuda.h"
#include "tandem/optim/adamw/adamw_math.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr size_t kWidth = 4;  // elements per vector access: 16 bytes of fp32

// The segments of one launch, passed by value in the kernel's parameter space (about
// 2.2 KB of the 4 KB every architecture allows), so a launch needs no device memory.
struct SegmentTable {
  unsigned count;
  unsigned long long begin[kAdamWSegmentsPerLaunch], end[kAdamWSegmentsPerLaunch];
  bool decay[kAdamWSegmentsPerLaunch];
};

// Raw pointers: the kernel's view of AdamWArrays.
struct Arrays {
  float* __restrict__ params;
  float* __restrict__ m;
  float* __restrict__ v;
  const void* __restrict__ grads;
  uint16_t* __restrict__ params16;
};

__device__ __forceinline__ bool aligned_to(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <GradDType G>
__device__ __forceinline__ float grad_at(const void* grads, size_t i) {
  if constexpr (G == GradDType::kF32) {
    return static_cast<const float*>(grads)[i];
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(grads)[i]);
  }
}

template <WorkingDType W>
__device__ __forceinline__ uint16_t to_working(float p) {
  if constexpr (W == WorkingDType::kBF16) return float_to_bf16(p);
  return float_to_fp16(p);
}

template <GradDType G, WorkingDType W>
__device__ __forceinline__ void update_one(const Arrays& a, size_t i, const AdamWStepScalars& s) {
  const AdamWElement e = adamw_element(a.params[i], grad_at<G>(a.grads, i), a.m[i], a.v[i], s);
  a.params[i] = e.param;
  a.m[i] = e.m;
  a.v[i] = e.v;
  if constexpr (W == WorkingDType::kBF16 || W == WorkingDType::kF16)
    a.params16[i] = to_working<W>(e.param);
}

// Elements [i, i + 4) with 16-byte loads and stores (8-byte for 16-bit arrays); i is
// aligned for every array.
template <GradDType G, WorkingDType W>
__device__ __forceinline__ void update_four(const Arrays& a, size_t i, const AdamWStepScalars& s) {
  const float4 p = *reinterpret_cast<const float4*>(a.params + i);
  const float4 m = *reinterpret_cast<const float4*>(a.m + i);
  const float4 v = *reinterpret_cast<const float4*>(a.v + i);
  float g[kWidth];
  if constexpr (G == GradDType::kF32) {
    const float4 g4 = *reinterpret_cast<const float4*>(static_cast<const float*>(a.grads) + i);
    g[0] = g4.x, g[1] = g4.y, g[2] = g4.z, g[3] = g4.w;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(a.grads) + i);
    g[0] = bf16_to_float(static_cast<uint16_t>(raw.x & 0xffffu));
    g[1] = bf16_to_float(static_cast<uint16_t>(raw.x >> 16));
    g[2] = bf16_to_float(static_cast<uint16_t>(raw.y & 0xffffu));
    g[3] = bf16_to_float(static_cast<uint16_t>(raw.y >> 16));
  }
  const AdamWElement e0 = adamw_element(p.x, g[0], m.x, v.x, s);
  const AdamWElement e1 = adamw_element(p.y, g[1], m.y, v.y, s);
  const AdamWElement e2 = adamw_element(p.z, g[2], m.z, v.z, s);
  const AdamWElement e3 = adamw_element(p.w, g[3], m.w, v.w, s);
  *reinterpret_cast<float4*>(a.params + i) = make_float4(e0.param, e1.param, e2.param, e3.param);
  *reinterpret_cast<float4*>(a.m + i) = make_float4(e0.m, e1.m, e2.m, e3.m);
  *reinterpret_cast<float4*>(a.v + i) = make_float4(e0.v, e1.v, e2.v, e3.v);
  if constexpr (W == WorkingDType::kBF16 || W == WorkingDType::kF16) {
    uint2 out;
    out.x = static_cast<unsigned>(to_working<W>(e0.param)) |
            (static_cast<unsigned>(to_working<W>(e1.param)) << 16);
    out.y = static_cast<unsigned>(to_working<W>(e2.param)) |
            (static_cast<unsigned>(to_working<W>(e3.param)) << 16);
    *reinterpret_cast<uint2*>(a.params16 + i) = out;
  }
}

// Whether element i starts a vector for every array: then [i, ...) runs on 16-byte
// accesses, else the whole segment runs element by element (the arrays are not
// co-aligned: never in the update engine's layout when subgroup sizes are multiples of 4).
template <GradDType G, WorkingDType W>
__device__ __forceinline__ bool vectors_from(const Arrays& a, size_t i) {
  const bool grads = G == GradDType::kF32
                         ? aligned_to(static_cast<const float*>(a.grads) + i, 16)
                         : aligned_to(static_cast<const uint16_t*>(a.grads) + i, 8);
  const bool working =
      !(W == WorkingDType::kBF16 || W == WorkingDType::kF16) || aligned_to(a.params16 + i, 8);
  return aligned_to(a.params + i, 16) && aligned_to(a.m + i, 16) && aligned_to(a.v + i, 16) &&
         grads && working;
}

// Every segment in turn (the loop is uniform across the grid, so no thread searches for
// its segment), each as a scalar head up to the first 16-byte boundary, a grid-stride body
// of 4-element vectors, and a scalar tail. Consecutive threads touch consecutive vectors:
// every access is coalesced.
template <GradDType G, WorkingDType W>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(Arrays a, SegmentTable table, AdamWStepScalars with_decay,
                 AdamWStepScalars without_decay) {
  const size_t threads = static_cast<size_t>(blockDim.x) * gridDim.x;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (unsigned k = 0; k < table.count; k++) {
    const AdamWStepScalars& s = table.decay[k] ? with_decay : without_decay;
    const size_t begin = table.begin[k], end = table.end[k];
    const size_t misalignment = reinterpret_cast<uintptr_t>(a.params + begin) % 16 / sizeof(float);
    size_t head = misalignment == 0 ? 0 : kWidth - misalignment;
    if (head > end - begin) head = end - begin;
    if (!vectors_from<G, W>(a, begin + head)) head = end - begin;
    const size_t body_begin = begin + head;
    const size_t vectors = (end - body_begin) / kWidth;
    const size_t tail_begin = body_begin + vectors * kWidth;
    for (size_t i = begin + thread; i < body_begin; i += threads) update_one<G, W>(a, i, s);
    for (size_t j = thread; j < vectors; j += threads)
      update_four<G, W>(a, body_begin + j * kWidth, s);
    for (size_t i = tail_begin + thread; i < end; i += threads) update_one<G, W>(a, i, s);
  }
}

template <GradDType G, WorkingDType W>
void launch(const Arrays& a, const SegmentTable& table, size_t n,
            const AdamWStepScalars& with_decay, const AdamWStepScalars& without_decay,
            cudaStream_t stream) {
  // One vector per thread up to a grid that fills any current GPU several times over;
  // the grid-stride loops cover the rest.
  const size_t wanted = (n + kWidth * kThreads - 1) / (kWidth * kThreads);
  const unsigned blocks = static_cast<unsigned>(wanted < 4096 ? (wanted > 0 ? wanted : 1) : 4096);
  adamw_kernel<G, W><<<blocks, kThreads, 0, stream>>>(a, table, with_decay, without_decay);
}

template <GradDType G>
void launch_for_working(WorkingDType working, const Arrays& a, const SegmentTable& table, size_t n,
                        const AdamWStepScalars& with_decay, const AdamWStepScalars& without_decay,
                        cudaStream_t stream) {
  switch (working) {
    case WorkingDType::kBF16:
      launch<G, WorkingDType::kBF16>(a, table, n, with_decay, without_decay, stream);
      break;
    case WorkingDType::kF16:
      launch<G, WorkingDType::kF16>(a, table, n, with_decay, without_decay, stream);
      break;
    default:
      launch<G, WorkingDType::kNone>(a, table, n, with_decay, without_decay, stream);
      break;
  }
}

}  // namespace

void launch_adamw_cuda(const AdamWArrays& arrays, const UpdateSegment* segments,
                       size_t num_segments, const AdamWStepScalars& with_decay,
                       const AdamWStepScalars& without_decay, void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const Arrays a{arrays.params, arrays.m, arrays.v, arrays.grads,
                 static_cast<uint16_t*>(arrays.params16)};
  const WorkingDType working =
      arrays.params16 != nullptr ? arrays.params16_dtype : WorkingDType::kNone;
  for (size_t first = 0; first < num_segments; first += kAdamWSegmentsPerLaunch) {
    SegmentTable table{};
    size_t n = 0;
    for (size_t k = first; k < num_segments && k < first + kAdamWSegmentsPerLaunch; k++) {
      if (segments[k].end <= segments[k].begin) continue;
      table.begin[table.count] = segments[k].begin;
      table.end[table.count] = segments[k].end;
      table.decay[table.count] = segments[k].weight_decay;
      table.count++;
      n += segments[k].end - segments[k].begin;
    }
    if (n == 0) continue;
    if (arrays.grad_dtype == GradDType::kF32) {
      launch_for_working<GradDType::kF32>(working, a, table, n, with_decay, without_decay,
                                          cuda_stream);
    } else {
      launch_for_working<GradDType::kBF16>(working, a, table, n, with_decay, without_decay,
                                           cuda_stream);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) fail("AdamW kernel launch failed: ", cudaGetErrorString(err));
  }
}

}  // namespace tandem
