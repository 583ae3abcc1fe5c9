// Byte-size constants and alignment helpers shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;
inline constexpr std::uint64_t kGiB = 1024 * kMiB;
inline constexpr std::uint64_t kTiB = 1024 * kGiB;

// O_DIRECT needs offsets, lengths and buffer addresses aligned to the logical block size; 4 KiB
// covers every NVMe drive we target. SIMD wants 64 B (one AVX-512 register, one cache line).
inline constexpr std::size_t kDirectIoAlignment = 4096;
inline constexpr std::size_t kSimdAlignment = 64;

constexpr std::uint64_t round_up(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

constexpr std::uint64_t round_down(std::uint64_t value, std::uint64_t alignment) {
  return value / alignment * alignment;
}

constexpr bool is_aligned(std::uint64_t value, std::uint64_t alignment) {
  return value % alignment == 0;
}

}  // namespace strata
