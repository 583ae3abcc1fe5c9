// fp32 <-> bf16 / fp16 conversions, round to nearest even, NaN and infinity preserved; fp16
// overflows to infinity and keeps subnormals. Host-side and scalar: checkpoint I/O only.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace strata::gpt::detail {

inline std::uint16_t float_to_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

inline float bf16_to_float(std::uint16_t value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value) << 16);
}

inline std::uint16_t float_to_fp16(float value) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits >= 0x7f800000u) {  // infinity or NaN
    return static_cast<std::uint16_t>(sign | (bits > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (bits >= 0x477ff000u) {  // >= 65520: rounds past the largest half, 65504
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (bits < 0x38800000u) {  // below 2⁻¹⁴: a half subnormal (or zero), in units of 2⁻²⁴
    // Exact scaling by a power of two, then the FPU's round to nearest even; 1024 encodes the
    // smallest normal correctly.
    const float scaled = std::bit_cast<float>(bits) * 0x1p24f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  bits += 0xfffu + ((bits >> 13) & 1u);  // round the 13 dropped mantissa bits to nearest even
  bits -= (127u - 15u) << 23;            // rebias the exponent
  return static_cast<std::uint16_t>(sign | (bits >> 13));
}

inline float fp16_to_float(std::uint16_t value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value & 0x8000u) << 16;
  const std::uint32_t exponent = (value >> 10) & 0x1fu;
  const std::uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2⁻²⁴, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(magnitude) | sign);
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace strata::gpt::detail
