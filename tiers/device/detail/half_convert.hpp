// Scalar fp32 <-> bf16 / fp16 conversions, round to nearest even, shared verbatim by the host
// kernels and the CUDA kernels so both backends produce the same bits.
//
// NaN inputs give a quiet NaN with the sign and the top payload bits kept (what x86 F16C and
// CUDA's cvt instructions do); +-inf stays inf; values past the largest finite value round to inf
// exactly where IEEE round-to-nearest-even says (fp16: |x| >= 65520); fp16 denormals are produced
// and consumed exactly. bf16 keeps fp32's exponent range, so fp32 denormals map to bf16 denormals.
//
// TODO(unify): cpu_adam/dtype.hpp carries its own copy (to_bf16, to_fp16, to_float), written for
// its SIMD loops; one should become the other. Both are checked bit for bit against independent
// references (tests/tiers/cast_test.cpp, tests/cpu_adam/dtype_test.cpp), so they agree today.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STRATA_HOST_DEVICE inline
#endif

namespace strata::tiers::detail {

STRATA_HOST_DEVICE std::uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

STRATA_HOST_DEVICE float bits_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

STRATA_HOST_DEVICE std::uint16_t fp32_to_bf16(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate the payload, force the quiet bit
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry out of the mantissa bumps
  // the exponent, which is exactly right (and turns the largest values into inf).
  const std::uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

STRATA_HOST_DEVICE float bf16_to_fp32(std::uint16_t value) {
  return bits_float(static_cast<std::uint32_t>(value) << 16);
}

// Branch-free (every path computed, then selected), so the host loop vectorises and GPU warps
// do not diverge.
STRATA_HOST_DEVICE std::uint16_t fp32_to_fp16(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  // Normal fp16: rebias the exponent 127 -> 15 and drop 13 mantissa bits, adding 0x0fff plus the
  // lowest kept bit to round half to even. A carry out of the mantissa bumps the exponent, which
  // is right, and turns [65520, 65536) into inf.
  const std::uint32_t rebased = magnitude - (112u << 23);
  const std::uint32_t normal = (rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13;
  // Denormal fp16 (|x| < 2^-14): adding 0.5 puts the value's 2^-24 units at the bottom of the fp32
  // mantissa (0.5 has an ulp of 2^-24), so the FPU's own round-to-nearest-even does the rounding;
  // 0x400 (the smallest normal) comes out when it rounds up.
  const std::uint32_t denormal = float_bits(bits_float(magnitude) + 0.5f) - (126u << 23);
  // NaN: keep the top 10 payload bits, force the quiet bit.
  const std::uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x03ffu);
  std::uint32_t result = magnitude < (113u << 23) ? denormal : normal;
  result = magnitude >= (143u << 23) ? 0x7c00u : result;  // >= 65536 (and inf): inf
  result = magnitude > 0x7f800000u ? nan : result;
  return static_cast<std::uint16_t>(sign | result);
}

STRATA_HOST_DEVICE float fp16_to_fp32(std::uint16_t value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value & 0x8000u) << 16;
  const std::uint32_t exponent = (value >> 10) & 0x1fu;
  std::uint32_t mantissa = value & 0x03ffu;
  if (exponent == 0x1fu) {  // inf / NaN (payload kept)
    return bits_float(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0u) {
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  if (mantissa == 0u) {
    return bits_float(sign);
  }
  // Denormal: normalise. The value is mantissa * 2^-24, exactly representable in fp32.
  std::uint32_t shifted_exponent = 113u;  // exponent of 2^-14 in fp32 bias
  while ((mantissa & 0x0400u) == 0u) {
    mantissa <<= 1;
    --shifted_exponent;
  }
  return bits_float(sign | (shifted_exponent << 23) | ((mantissa & 0x03ffu) << 13));
}

}  // namespace strata::tiers::detail
