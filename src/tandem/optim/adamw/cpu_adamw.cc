#include "tandem/optim/adamw/cpu_adamw.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/optim/adamw/adamw_simd.h"

namespace tandem {
namespace {
constexpr size_t kChunkElements = size_t{1} << 16;
}  // namespace

CpuAdamW::CpuAdamW(ThreadPool& pool, SimdTarget target) : pool_(pool), target_(target) {
  TANDEM_CHECK(cpu_supports(target), "this CPU does not support the ", simd_target_name(target),
               " AdamW kernel; use ", simd_target_name(best_simd_target()), " or scalar");
}

void CpuAdamW::update(const AdamWArrays& arrays, std::span<const UpdateSegment> segments,
                      const AdamWStepScalars& with_decay, const AdamWStepScalars& without_decay) {
  if (segments.empty()) return;
  const size_t total = segments.back().end;
  // Chunks of whole 256-byte lines (a thread's first vector and cache line its own), each
  // long enough (64K elements, 1 MiB of the four arrays) that claiming it costs nothing
  // against streaming it.
  pool_.parallel_for(total, kChunkElements, [&](size_t chunk_begin, size_t chunk_end) {
    for (const UpdateSegment& segment : segments) {
      const size_t begin = std::max(segment.begin, chunk_begin);
      const size_t end = std::min(segment.end, chunk_end);
      if (begin >= end) continue;
      adamw_kernel(target_, arrays.slice(begin), end - begin,
                   segment.weight_decay ? with_decay : without_decay);
    }
  });
}

void CpuAdamW::update(const AdamWArrays& arrays, size_t n, const AdamWStepScalars& scalars) {
  const UpdateSegment all{0, n, false};
  update(arrays, std::span<const UpdateSegment>(&all, 1), scalars, scalars);
}

}  // namespace tandem
