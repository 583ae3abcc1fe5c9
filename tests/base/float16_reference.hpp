// Independent references for the fp32 <-> bf16/fp16 conversions of base/float16.hpp, none of which
// uses the conversions' own bit tricks: the nearest representable code found by search or by exact
// distances in double, ties to the even code. Shared by the rounding test (tests/base/) and the
// device cast kernels' test (tests/tiers/device/).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/debug_knobs.hpp"

namespace strata::float16_reference {

// STRATA_TEST_SEED overrides the default seed; tests print the seed they used on failure.
inline std::uint64_t test_seed(std::uint64_t fallback) {
  return test_seed_knob().value_or(fallback);
}

inline std::string seed_note(std::uint64_t seed) {
  return "seed=" + std::to_string(seed) + " (rerun with STRATA_TEST_SEED=" + std::to_string(seed) +
         ")";
}

// A binary format with 1 sign bit, `exponent_bits`, `mantissa_bits` (bf16: 8/7, fp16: 5/10).
struct Format {
  int exponent_bits;
  int mantissa_bits;
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  std::uint16_t inf_code() const {
    return static_cast<std::uint16_t>(((1u << exponent_bits) - 1u) << mantissa_bits);
  }
  // The magnitude of a non-negative code, by the textbook formula. inf_code() decodes as the next
  // power of two past the largest finite value, which is where rounding to inf starts.
  double magnitude(std::uint16_t code) const {
    const int exponent = code >> mantissa_bits;
    const int mantissa = code & ((1 << mantissa_bits) - 1);
    if (exponent == 0) {
      return std::ldexp(static_cast<double>(mantissa), 1 - bias() - mantissa_bits);
    }
    return std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -mantissa_bits),
                      exponent - bias());
  }
};

inline constexpr Format kBf16{8, 7};
inline constexpr Format kFp16{5, 10};

// Reference for finite and infinite inputs (NaNs are checked separately).
inline std::uint16_t reference_round(const Format& format, float value) {
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  const std::uint16_t inf = format.inf_code();
  if (magnitude >= format.magnitude(inf)) {
    return sign | inf;
  }
  // Largest code whose magnitude is <= the input: codes are ordered like their magnitudes.
  std::uint16_t low = 0;
  std::uint16_t high = inf;  // invariant: magnitude(low) <= input < magnitude(high)
  while (high - low > 1) {
    const auto middle = static_cast<std::uint16_t>((low + high) / 2);
    (format.magnitude(middle) <= magnitude ? low : high) = middle;
  }
  const double below = magnitude - format.magnitude(low);  // exact in double
  const double above = format.magnitude(high) - magnitude;
  std::uint16_t nearest = below < above ? low : high;
  if (below == above) {
    nearest = (low & 1u) == 0 ? low : high;
  }
  return sign | nearest;
}

inline float reference_decode(const Format& format, std::uint16_t code) {
  const double magnitude = format.magnitude(code & 0x7fff);
  return static_cast<float>((code & 0x8000) != 0 ? -magnitude : magnitude);
}

inline bool is_nan_code(const Format& format, std::uint16_t code) {
  const std::uint16_t inf = format.inf_code();
  return (code & inf) == inf && (code & ((1u << format.mantissa_bits) - 1u)) != 0;
}

// Round-to-nearest-even to bf16 by comparing distances in double; a NaN keeps its sign and top
// payload with the quiet bit set.
inline std::uint16_t reference_bf16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t down = bits & 0xFFFF0000u;
  const std::uint32_t up = down + 0x10000u;
  const double low = std::bit_cast<float>(down);
  // Past the largest finite bf16 the next step up is where 2^128 would be.
  const double high = (up & 0x7F800000u) == 0x7F800000u && (down & 0x7F800000u) != 0x7F800000u
                          ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(value))
                          : static_cast<double>(std::bit_cast<float>(up));
  const double distance_low = std::fabs(static_cast<double>(value) - low);
  const double distance_high = std::fabs(high - static_cast<double>(value));
  std::uint32_t chosen = down;
  if (distance_high < distance_low || (distance_high == distance_low && ((down >> 16) & 1u) != 0)) {
    chosen = up;
  }
  return static_cast<std::uint16_t>(chosen >> 16);
}

// Special values, every exact midpoint between neighbouring codes of both formats (the ties) and
// the floats just around them, and seeded random bit patterns.
inline std::vector<float> cast_inputs(std::uint64_t seed) {
  std::vector<float> inputs = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::denorm_min(),
                               std::bit_cast<float>(std::uint32_t{0x007fffff}),
                               65504.0f,
                               65519.996f,
                               65520.0f,
                               -65520.0f,
                               65536.0f,
                               1e10f,
                               std::ldexp(1.0f, -24),
                               std::ldexp(1.0f, -25),
                               std::ldexp(3.0f, -26),
                               std::ldexp(1.5f, -24),
                               std::ldexp(1.0f, -14),
                               std::ldexp(1023.0f, -24),
                               std::ldexp(2047.0f, -25),
                               1.0f + std::ldexp(1.0f, -8),
                               1.0f + std::ldexp(3.0f, -8),
                               1.0f + std::ldexp(1.0f, -11),
                               1.0f + std::ldexp(3.0f, -11)};
  for (const Format& format : {kBf16, kFp16}) {
    for (std::uint32_t code = 0; code + 1 < format.inf_code(); ++code) {
      const double middle = (format.magnitude(static_cast<std::uint16_t>(code)) +
                             format.magnitude(static_cast<std::uint16_t>(code + 1))) /
                            2;
      const float tie = static_cast<float>(middle);
      if (static_cast<double>(tie) != middle) {
        continue;  // not representable in fp32 (below fp32's denormals): no tie to test
      }
      for (const float value : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e38f)}) {
        inputs.push_back(value);
        inputs.push_back(-value);
      }
    }
  }
  std::mt19937 random(static_cast<std::uint32_t>(seed));
  for (int i = 0; i < 100000; ++i) {
    const float value = std::bit_cast<float>(static_cast<std::uint32_t>(random()));
    if (!std::isnan(value)) {
      inputs.push_back(value);
    }
  }
  return inputs;
}

inline const std::vector<std::uint32_t> kNanInputs = {0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                                      0xff800001u, 0x7fbfffffu, 0x7fc12345u,
                                                      0xffffffffu};

}  // namespace strata::float16_reference
