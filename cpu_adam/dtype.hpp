// Element types of host tensors (fp32, bf16, fp16), their exact scalar conversions, and typed
// views of host memory. Every strata layer that converts between these types uses these helpers,
// so the bits agree everywhere: the SIMD kernels in cpu_adam/ are tested bit-for-bit against them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>

// The conversions are always inlined: the per-ISA kernel files call them from code compiled with
// AVX-512 or AVX2 flags, and an out-of-line copy from such a file must never be what the linker
// hands to code that runs on a lesser CPU (it would at -O0 otherwise).
// For the same reason they use the compiler builtin behind std::bit_cast: at -O0 std::bit_cast is
// itself an out-of-line function.
#if defined(__GNUC__)
#define STRATA_CONVERSION [[gnu::always_inline]] constexpr
#define STRATA_BIT_CAST(To, value) __builtin_bit_cast(To, value)
#else
#define STRATA_CONVERSION constexpr
#define STRATA_BIT_CAST(To, value) std::bit_cast<To>(value)
#endif

namespace strata::cpu_adam {

enum class Dtype : std::uint8_t { kFp32 = 0, kBf16 = 1, kFp16 = 2 };
inline constexpr int kDtypeCount = 3;

// Raw 16-bit storage types: distinct types so a bf16 buffer cannot be passed where fp16 is meant.
struct Bf16 {
  std::uint16_t bits;
};
struct Fp16 {
  std::uint16_t bits;
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2);

constexpr std::size_t dtype_bytes(Dtype dtype) {
  return dtype == Dtype::kFp32 ? 4 : 2;
}

constexpr std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32:
      return "fp32";
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp16:
      return "fp16";
  }
  return "?";
}

// Accepts the names dtype_name() prints; anything else is nullopt.
constexpr std::optional<Dtype> parse_dtype(std::string_view text) {
  for (Dtype dtype : {Dtype::kFp32, Dtype::kBf16, Dtype::kFp16}) {
    if (text == dtype_name(dtype)) return dtype;
  }
  return std::nullopt;
}

template <class T>
constexpr Dtype dtype_of();
template <>
constexpr Dtype dtype_of<float>() {
  return Dtype::kFp32;
}
template <>
constexpr Dtype dtype_of<Bf16>() {
  return Dtype::kBf16;
}
template <>
constexpr Dtype dtype_of<Fp16>() {
  return Dtype::kFp16;
}

// bf16 -> fp32 is exact: the bf16 bits are the top half of the fp32 bits (NaN payloads kept).
STRATA_CONVERSION float to_float(Bf16 value) {
  return STRATA_BIT_CAST(float, static_cast<std::uint32_t>(value.bits) << 16);
}

// fp32 -> bf16, round to nearest even. NaN stays NaN (quiet bit set, sign and top payload kept);
// overflow rounds to infinity; denormals round like any other value (no flush to zero, unlike
// AVX512_BF16's vcvtneps2bf16, which is why the kernels do not use it).
STRATA_CONVERSION Bf16 to_bf16(float value) {
  const std::uint32_t bits = STRATA_BIT_CAST(std::uint32_t, value);
  const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  const std::uint32_t quiet_nan = bits | 0x0040'0000u;
  // A select rather than a branch, so loops over it vectorise.
  const bool is_nan = (bits & 0x7FFF'FFFFu) > 0x7F80'0000u;
  return Bf16{static_cast<std::uint16_t>((is_nan ? quiet_nan : rounded) >> 16)};
}

// fp16 -> fp32 is exact. Matches F16C's vcvtph2ps bit for bit, NaNs included (quiet bit set).
STRATA_CONVERSION float to_float(Fp16 value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (value.bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = value.bits & 0x3FFu;
  if (exponent == 0x1F) {  // inf or NaN
    const std::uint32_t quiet = mantissa != 0 ? 0x0040'0000u : 0u;
    return STRATA_BIT_CAST(float, sign | 0x7F80'0000u | (mantissa << 13) | quiet);
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24 is exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return STRATA_BIT_CAST(float, sign | STRATA_BIT_CAST(std::uint32_t, magnitude));
  }
  return STRATA_BIT_CAST(float, sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// fp32 -> fp16, round to nearest even, overflow to infinity, subnormals kept. Matches F16C's
// vcvtps2ph with _MM_FROUND_TO_NEAREST_INT bit for bit (NaN: quiet bit set, top payload kept).
STRATA_CONVERSION Fp16 to_fp16(float value) {
  const std::uint32_t bits = STRATA_BIT_CAST(std::uint32_t, value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7FFF'FFFFu;
  std::uint32_t result = 0;
  if (magnitude > 0x7F80'0000u) {
    result = 0x7E00u | ((magnitude >> 13) & 0x3FFu);
  } else if (magnitude >= 0x477F'F000u) {  // >= 65520: rounds past 65504 to infinity
    result = 0x7C00u;
  } else if (magnitude >= 0x3880'0000u) {  // >= 2^-14: normal fp16
    const std::uint32_t rounded = magnitude + 0xFFFu + ((magnitude >> 13) & 1u);
    result = (rounded >> 13) - (112u << 10);
  } else if (magnitude > 0x3300'0000u) {  // (2^-25, 2^-14): subnormal fp16, units of 2^-24
    const std::uint32_t exponent = magnitude >> 23;
    const std::uint32_t significand = (magnitude & 0x7F'FFFFu) | 0x80'0000u;
    const std::uint32_t shift = 126 - exponent;  // 14..24
    const std::uint32_t remainder = significand & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    result = significand >> shift;
    if (remainder > halfway || (remainder == halfway && (result & 1u) != 0)) ++result;
  }
  return Fp16{static_cast<std::uint16_t>(sign | result)};
}

STRATA_CONVERSION float to_float(float value) {
  return value;
}

// A view of `count` elements of `dtype` in host memory (non-owning). Null data means "absent",
// which is how optional outputs are passed.
struct TypedSpan {
  void* data = nullptr;
  std::size_t count = 0;
  Dtype dtype = Dtype::kFp32;

  TypedSpan() = default;
  TypedSpan(void* data_in, std::size_t count_in, Dtype dtype_in)
      : data(data_in), count(count_in), dtype(dtype_in) {}
  template <class T>
  TypedSpan(std::span<T> values)  // NOLINT(google-explicit-constructor): a span is a typed span
      : data(values.data()), count(values.size()), dtype(dtype_of<T>()) {}

  bool present() const { return data != nullptr; }
  std::size_t size_bytes() const { return count * dtype_bytes(dtype); }
};

struct ConstTypedSpan {
  const void* data = nullptr;
  std::size_t count = 0;
  Dtype dtype = Dtype::kFp32;

  ConstTypedSpan() = default;
  ConstTypedSpan(const void* data_in, std::size_t count_in, Dtype dtype_in)
      : data(data_in), count(count_in), dtype(dtype_in) {}
  template <class T>
  ConstTypedSpan(std::span<T> values)  // NOLINT(google-explicit-constructor)
      : data(values.data()), count(values.size()), dtype(dtype_of<std::remove_const_t<T>>()) {}
  ConstTypedSpan(TypedSpan span)  // NOLINT(google-explicit-constructor)
      : data(span.data), count(span.count), dtype(span.dtype) {}

  bool present() const { return data != nullptr; }
  std::size_t size_bytes() const { return count * dtype_bytes(dtype); }
};

}  // namespace strata::cpu_adam
