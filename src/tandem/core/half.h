// 16-bit floating-point formats: bfloat16 and IEEE binary16 (fp16).
//
// Conversions from float round to nearest, ties to even, and keep NaN a (quiet) NaN.
// These scalar functions are the definition: the SIMD kernels (F16C's vcvtps2ph, the
// integer bf16 rounding) produce exactly the same bits, which the tests check, and the
// CUDA kernels call these very functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "tandem/core/host_device.h"

namespace tandem {

// std::bit_cast for host and device code (CUDA sources are compiled as C++17).
template <typename To, typename From>
TANDEM_HOST_DEVICE inline To bit_copy(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

TANDEM_HOST_DEVICE inline float bf16_to_float(uint16_t h) {
  return bit_copy<float>(static_cast<uint32_t>(h) << 16);
}

TANDEM_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = bit_copy<uint32_t>(f);
  // NaN: truncating could clear every mantissa bit left (giving infinity); set the quiet bit.
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

TANDEM_HOST_DEVICE inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bit_copy<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bit_copy<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

TANDEM_HOST_DEVICE inline uint16_t float_to_fp16(float f) {
  const uint32_t bits = bit_copy<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u)  // NaN: quiet, payload truncated (as vcvtps2ph does)
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (magnitude <= 0x33000000u) return sign;            // <= 2^-25 rounds to zero
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a half subnormal, in units of 2^-24.
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - (magnitude >> 23);
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) result++;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits; a
  // carry out of the mantissa correctly bumps the exponent.
  uint32_t result = (magnitude - 0x38000000u) >> 13;
  const uint32_t remainder = magnitude & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) result++;
  return static_cast<uint16_t>(sign | result);
}

// A bfloat16 value as stored in a tensor. A type of its own (not a bare uint16_t) so
// that kernels overload on it; same size and bits as CUDA's __nv_bfloat16.
struct Bf16 {
  uint16_t bits;
};
static_assert(sizeof(Bf16) == 2);

// Storage conversions for code templated on the element type T (float or Bf16):
// computing happens in float, storing rounds once (to nearest even).
TANDEM_HOST_DEVICE inline float to_float(float x) { return x; }
TANDEM_HOST_DEVICE inline float to_float(Bf16 x) { return bf16_to_float(x.bits); }

template <typename T>
TANDEM_HOST_DEVICE inline T from_float(float x);
template <>
TANDEM_HOST_DEVICE inline float from_float<float>(float x) {
  return x;
}
template <>
TANDEM_HOST_DEVICE inline Bf16 from_float<Bf16>(float x) {
  return Bf16{float_to_bf16(x)};
}

}  // namespace tandem
