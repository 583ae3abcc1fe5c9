// DType: the one element type of strata's tensors and buffers. The config's precision, the CPU
// optimizer, the device kernels, the communicators and the safetensors files all speak it, so no
// layer converts between enums. C++17, so the CUDA sources (built as C++17) include it too. The floating types come first (fp32, bf16, fp16); only the
// communicators also move the integer types (raw bytes and counters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "base/float16.hpp"

namespace strata {

enum class DType : std::uint8_t { kFp32 = 0, kBf16 = 1, kFp16 = 2, kUint8 = 3, kUint64 = 4 };

// The floating types are DType values 0 .. kFloatDTypeCount - 1, so kernel tables index by them.
inline constexpr int kFloatDTypeCount = 3;

constexpr bool is_floating_point(DType dtype) {
  return static_cast<int>(dtype) < kFloatDTypeCount;
}

constexpr std::size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return 4;
    case DType::kBf16:
    case DType::kFp16:
      return 2;
    case DType::kUint8:
      return 1;
    case DType::kUint64:
      return 8;
  }
  return 0;
}

// The names configs, files and messages use: "fp32", "bf16", "fp16", "uint8", "uint64".
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return "fp32";
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kUint8:
      return "uint8";
    case DType::kUint64:
      return "uint64";
  }
  return "?";
}

// The floating type whose dtype_name() is `text`; anything else (the integer names included) is
// nullopt: every text a user types names a precision, and those are floating.
constexpr std::optional<DType> parse_floating_dtype(std::string_view text) {
  for (DType dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    if (text == dtype_name(dtype)) return dtype;
  }
  return std::nullopt;
}

// The C++ element types and their DType: float, Bf16, Fp16 (base/float16.hpp), uint8_t, uint64_t.
template <class T>
inline constexpr bool is_element_v = std::is_same_v<T, float> || std::is_same_v<T, Bf16> ||
                                     std::is_same_v<T, Fp16> || std::is_same_v<T, std::uint8_t> ||
                                     std::is_same_v<T, std::uint64_t>;

template <class T>
constexpr DType dtype_of() {
  static_assert(is_element_v<T>, "not an element type: float, Bf16, Fp16, uint8_t or uint64_t");
  if constexpr (std::is_same_v<T, float>) return DType::kFp32;
  if constexpr (std::is_same_v<T, Bf16>) return DType::kBf16;
  if constexpr (std::is_same_v<T, Fp16>) return DType::kFp16;
  if constexpr (std::is_same_v<T, std::uint8_t>) return DType::kUint8;
  return DType::kUint64;
}

template <class T>
inline constexpr DType dtype_v = dtype_of<T>();

}  // namespace strata
