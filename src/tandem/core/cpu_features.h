// Which SIMD instruction sets this CPU has, for runtime dispatch: one binary runs on
// any x86-64 machine and uses the best kernels it can.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "tandem/core/enum_names.h"

namespace tandem {

enum class SimdTarget {
  kScalar,  // portable C++
  kAvx2,    // AVX2 + FMA + F16C
  kAvx512,  // AVX-512 F + BW + VL (plus the AVX2 set)
};

inline constexpr EnumName<SimdTarget> kSimdTargetNames[] = {
    {SimdTarget::kScalar, "scalar"}, {SimdTarget::kAvx2, "avx2"}, {SimdTarget::kAvx512, "avx512"}};
constexpr std::string_view simd_target_name(SimdTarget target) {
  return enum_name(kSimdTargetNames, target);
}
inline std::optional<SimdTarget> parse_simd_target(std::string_view name) {
  return enum_from_exact_name(kSimdTargetNames, name);
}
bool cpu_supports(SimdTarget target);
// The best target this CPU supports.
SimdTarget best_simd_target();
// Every target this CPU supports, scalar first.
std::vector<SimdTarget> supported_simd_targets();

}  // namespace tandem
