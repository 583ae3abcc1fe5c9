// The 16-bit float formats (bf16, fp16) and strata's one set of conversions to and from fp32.
// Every layer converts with these functions (the CPU optimizer's scalar tails, the host and CUDA
// device kernels, the communicators' reductions, the safetensors readers and writers), so the bits
// agree everywhere; cpu_adam's SIMD kernels are tested bit for bit against them.
//
// Narrowing rounds to nearest, ties to even; values past the largest finite value become infinity
// exactly where IEEE says (fp16: |x| >= 65520); subnormals are produced and consumed exactly, never
// flushed (unlike AVX512_BF16's vcvtneps2bf16). A NaN stays a NaN with its sign, its top payload
// bits and the quiet bit set. fp16 -> fp32 matches F16C's vcvtph2ps bit for bit, NaNs included.
// tests/base/float16_test.cpp proves all of it against independent references.
//
// Header-only, C++17 (the .cu files build as C++17), callable from host and CUDA code
// (STRATA_HOST_DEVICE), always inlined.
#pragma once

#include <cstdint>

#include "base/host_device.hpp"

namespace strata {

// Raw 16-bit storage: distinct types, so bf16 bits cannot be passed where fp16 is meant.
struct Bf16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(Bf16 a, Bf16 b) { return a.bits == b.bits; }
};
struct Fp16 {
  std::uint16_t bits = 0;
  friend constexpr bool operator==(Fp16 a, Fp16 b) { return a.bits == b.bits; }
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2);

namespace detail {

// The compiler builtin rather than std::bit_cast: at -O0 std::bit_cast is an out-of-line function
// (see STRATA_FORCE_INLINE), and nvcc accepts the builtin in device code.
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr std::uint32_t float_bits(float value) {
  return __builtin_bit_cast(std::uint32_t, value);
}

STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr float bits_float(std::uint32_t bits) {
  return __builtin_bit_cast(float, bits);
}

}  // namespace detail

// bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32 bits (NaN payloads kept).
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr float to_float(Bf16 value) {
  return detail::bits_float(static_cast<std::uint32_t>(value.bits) << 16);
}

// fp32 -> bf16. Adding 0x7fff plus the lowest kept bit rounds half to even; a carry out of the
// mantissa bumps the exponent, which is exactly right (and turns the largest values into inf).
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr Bf16 to_bf16(float value) {
  const std::uint32_t bits = detail::float_bits(value);
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  const std::uint32_t quiet_nan = bits | 0x0040'0000u;
  // A select rather than a branch, so loops over it vectorise and GPU warps do not diverge.
  const bool is_nan = (bits & 0x7fff'ffffu) > 0x7f80'0000u;
  return Bf16{static_cast<std::uint16_t>((is_nan ? quiet_nan : rounded) >> 16)};
}

// fp16 -> fp32 is exact.
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr float to_float(Fp16 value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf or NaN (a NaN gets the quiet bit, as F16C does)
    const std::uint32_t quiet = mantissa != 0 ? 0x0040'0000u : 0u;
    return detail::bits_float(sign | 0x7f80'0000u | (mantissa << 13) | quiet);
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24 is exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return detail::bits_float(sign | detail::float_bits(magnitude));
  }
  return detail::bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// fp32 -> fp16. Branch-free (every path computed, then selected), so host loops vectorise and GPU
// warps do not diverge.
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr Fp16 to_fp16(float value) {
  const std::uint32_t bits = detail::float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fff'ffffu;
  // Normal fp16: rebias the exponent 127 -> 15 and drop 13 mantissa bits, adding 0x0fff plus the
  // lowest kept bit to round half to even. A carry out of the mantissa bumps the exponent, which
  // is right, and turns [65520, 65536) into inf.
  const std::uint32_t rebased = magnitude - (112u << 23);
  const std::uint32_t normal = (rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13;
  // Subnormal fp16 (|x| < 2^-14): adding 0.5 puts the value's 2^-24 units at the bottom of the
  // fp32 mantissa (0.5 has an ulp of 2^-24), so the FPU's own round-to-nearest-even does the
  // rounding; 0x400 (the smallest normal) comes out when it rounds up.
  const std::uint32_t subnormal =
      detail::float_bits(detail::bits_float(magnitude) + 0.5f) - (126u << 23);
  // NaN: keep the top 10 payload bits, force the quiet bit.
  const std::uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x03ffu);
  std::uint32_t result = magnitude < (113u << 23) ? subnormal : normal;
  result = magnitude >= (143u << 23) ? 0x7c00u : result;  // >= 65536 (and inf): inf
  result = magnitude > 0x7f80'0000u ? nan : result;
  return Fp16{static_cast<std::uint16_t>(sign | result)};
}

// The identity, so templates over the element type can call to_float on any floating element.
STRATA_HOST_DEVICE STRATA_FORCE_INLINE constexpr float to_float(float value) {
  return value;
}

}  // namespace strata
