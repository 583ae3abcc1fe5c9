// The stochastic rounding of bf16 master weights (compressed_step.hpp): the 16 noise bits of an
// element are a hash of (seed, step, element) only, so every thread count, SIMD level and the GPU
// draw the same bits. Header-only, C++17, callable from host and CUDA code (STRATA_HOST_DEVICE);
// the SIMD levels vectorise stochastic_noise lane by lane (detail/vector_ops.hpp) and are tested
// bit for bit against these functions.
//
// Element e's noise is stochastic_noise(rounding_high_key(rounding_key(seed, step), e), low32(e)):
// the 64-bit (seed, step) key and e's high 32 bits are mixed once per block, the 32-bit hash of
// e's low bits runs in the lanes.
#pragma once

#include <cstdint>

#include "base/float16.hpp"
#include "base/host_device.hpp"

namespace strata::cpu_adam {

// 32-bit lanes so it vectorises; the finalizer is Wellons' "lowbias32" (bias 0.17), after an odd
// multiply that spreads consecutive indices. Every step is a bijection of 32-bit words, so for a
// fixed key distinct elements never share noise.
inline constexpr std::uint32_t kNoiseSpread = 0x9E37'79B1u;
inline constexpr std::uint32_t kNoiseMix1 = 0x7FEB'352Du;
inline constexpr std::uint32_t kNoiseMix2 = 0x846C'A68Bu;

STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr std::uint64_t rounding_key(std::uint64_t seed,
                                                                            std::uint64_t step) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + step;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr std::uint32_t rounding_high_key(
    std::uint64_t key, std::uint64_t element) {
  std::uint64_t x = key ^ ((element >> 32) * 0xD1B54A32D192ED03ull);
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<std::uint32_t>(x);
}

// The noise of the element whose low 32 bits are `low`, under the key of its high 32 bits.
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr std::uint32_t stochastic_noise(
    std::uint32_t high_key, std::uint32_t low) {
  std::uint32_t x = low * kNoiseSpread + high_key;
  x ^= x >> 16;
  x *= kNoiseMix1;
  x ^= x >> 15;
  x *= kNoiseMix2;
  x ^= x >> 16;
  return x;
}

// fp32 -> bf16 bits given the noise: add 16 random bits below the kept ones and cut them off, so
// the result rounds up with probability (distance to the lower bf16) / (bf16 spacing). Inf and
// NaN round to nearest (NaNs stay NaN). Integer arithmetic only: exact anywhere.
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr Bf16 round_stochastic(float value,
                                                                       std::uint32_t noise) {
  const std::uint32_t bits = strata::detail::float_bits(value);
  if ((bits & 0x7F80'0000u) == 0x7F80'0000u) return to_bf16(value);
  return Bf16{static_cast<std::uint16_t>((bits + (noise & 0xFFFFu)) >> 16)};
}

}  // namespace strata::cpu_adam
