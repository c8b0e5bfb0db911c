#include "tandem/core/cpu_features.h"

namespace tandem {

bool cpu_supports(SimdTarget target) {
  switch (target) {
    case SimdTarget::kScalar:
      return true;
    case SimdTarget::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case SimdTarget::kAvx512:
      return cpu_supports(SimdTarget::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
}

SimdTarget best_simd_target() {
  if (cpu_supports(SimdTarget::kAvx512)) return SimdTarget::kAvx512;
  if (cpu_supports(SimdTarget::kAvx2)) return SimdTarget::kAvx2;
  return SimdTarget::kScalar;
}

std::vector<SimdTarget> supported_simd_targets() {
  std::vector<SimdTarget> targets;
  for (SimdTarget t : {SimdTarget::kScalar, SimdTarget::kAvx2, SimdTarget::kAvx512})
    if (cpu_supports(t)) targets.push_back(t);
  return targets;
}

}  // namespace tandem
