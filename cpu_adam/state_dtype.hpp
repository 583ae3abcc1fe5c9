// The element formats of optimizer state (master weights, moments) and their sizes; the byte
// layout of each is described in state_format.hpp. A plain C++17 header: configs, plans and the
// CUDA optimizer include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata::cpu_adam {

enum class StateDType : std::uint8_t { kFp32 = 0, kBf16 = 1, kInt8 = 2 };
inline constexpr int kStateDTypeCount = 3;

// Which moment a buffer holds: it picks the int8 code (signed or non-negative).
enum class MomentKind : std::uint8_t { kExpAvg = 0, kExpAvgSq = 1 };

inline constexpr std::size_t kQuantBlockBytes = 1024;
inline constexpr std::size_t kQuantBlockElems = kQuantBlockBytes - sizeof(float);

// The int8 codes (state_format.hpp): the largest signed code (exp_avg) and the largest
// non-negative one (exp_avg_sq). Decoding multiplies by the fp32 reciprocals of 127^2 and 255
// instead of dividing; both reciprocals times their divisor round to exactly 1, so the top codes
// still decode to the scale itself and encode(decode(x)) keeps every scale and code.
inline constexpr float kSignedCodeMax = 127.0f;
inline constexpr float kUnsignedCodeMax = 255.0f;
inline constexpr float kSignedCodeInverseSquare = 1.0f / (127.0f * 127.0f);
inline constexpr float kUnsignedCodeInverse = 1.0f / 255.0f;
static_assert(kSignedCodeInverseSquare * (127.0f * 127.0f) == 1.0f);
static_assert(kUnsignedCodeInverse * 255.0f == 1.0f);

std::string_view state_dtype_name(StateDType dtype);  // "fp32", "bf16", "int8"
std::optional<StateDType> parse_state_dtype(std::string_view text);

// Bytes that `numel` elements take in `dtype` (int8: whole blocks).
std::uint64_t state_bytes(StateDType dtype, std::uint64_t numel);

}  // namespace strata::cpu_adam
