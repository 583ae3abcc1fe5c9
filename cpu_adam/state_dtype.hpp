// The element formats of optimizer state (master weights, moments) and their sizes; the byte
// layout of each is described in state_format.hpp. A plain header: configs and plans include it.
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

std::string_view state_dtype_name(StateDType dtype);  // "fp32", "bf16", "int8"
std::optional<StateDType> parse_state_dtype(std::string_view text);

// Bytes that `numel` elements take in `dtype` (int8: whole blocks).
std::uint64_t state_bytes(StateDType dtype, std::uint64_t numel);

}  // namespace strata::cpu_adam
