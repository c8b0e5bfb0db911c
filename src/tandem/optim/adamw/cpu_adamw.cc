#include "tandem/optim/adamw/cpu_adamw.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/optim/adamw/adamw_simd.h"

namespace tandem {

CpuAdamW::CpuAdamW(ThreadPool& pool, SimdTarget target) : pool_(pool), target_(target) {
  TANDEM_CHECK(cpu_supports(target), "this CPU does not support the ", simd_target_name(target),
               " AdamW kernel; use ", simd_target_name(best_simd_target()), " or scalar");
}

void CpuAdamW::update(const AdamWArrays& arrays, std::span<const UpdateSegment> segments,
                      const AdamWStepScalars& with_decay, const AdamWStepScalars& without_decay) {
  if (segments.empty()) return;
  const size_t total = segments.back().end;
  pool_.run([&](int worker) {
    // 64 elements: a 256-byte boundary keeps every thread's first vector and cache line
    // its own.
    const Range mine = split_range(total, pool_.size(), worker, 64);
    for (const UpdateSegment& segment : segments) {
      const size_t begin = std::max(segment.begin, mine.begin);
      const size_t end = std::min(segment.end, mine.end);
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
