// Element types the device kernels understand. Sizes in bytes; all three are plain IEEE-style
// encodings (bf16 = the upper half of an fp32, fp16 = IEEE binary16).
#pragma once

#include <cstddef>
#include <string_view>

namespace strata::tiers {

enum class DType { kFloat32, kBFloat16, kFloat16 };

constexpr std::size_t dtype_bytes(DType type) {
  return type == DType::kFloat32 ? 4 : 2;
}

constexpr std::string_view dtype_name(DType type) {
  switch (type) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "?";
}

}  // namespace strata::tiers
