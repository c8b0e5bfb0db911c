// The CPU AdamW update at host-memory speed: the SIMD kernel of the best instruction
// set, run on a pinned thread pool, each thread streaming its own contiguous range of
// the flat parameter space. Results are bit-identical to adamw_reference whatever the
// target and the number of threads (the update is elementwise; a thread count only
// moves range boundaries).
#pragma once

#include <span>
#include <vector>

#include "tandem/core/cpu_features.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/adamw/adamw_reference.h"

namespace tandem {

class CpuAdamW {
 public:
  explicit CpuAdamW(ThreadPool& pool, SimdTarget target = best_simd_target());

  SimdTarget target() const { return target_; }
  int threads() const { return pool_.size(); }

  // Updates every segment (element indices relative to `arrays`), one pool dispatch.
  void update(const AdamWArrays& arrays, std::span<const UpdateSegment> segments,
              const AdamWStepScalars& with_decay, const AdamWStepScalars& without_decay);
  // Updates elements [0, n) with one set of scalars.
  void update(const AdamWArrays& arrays, size_t n, const AdamWStepScalars& scalars);

 private:
  ThreadPool& pool_;
  SimdTarget target_;
};

}  // namespace tandem
