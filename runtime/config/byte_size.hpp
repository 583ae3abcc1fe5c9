// Byte sizes as users write them ("64GiB", "1MiB", "512k", "4096") and as strata prints them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::runtime {

// Parses a size string. Binary suffixes: k, K, KiB, m, M, MiB, g, G, GiB, t, T, TiB (powers of
// 1024, as fio reads them); decimal suffixes: KB, MB, GB, TB (powers of 1000); B or no suffix:
// bytes. A fractional number is allowed ("1.5GiB") when the result is a whole number of bytes.
// Returns nullopt for anything else (empty, negative, unknown suffix, overflow).
std::optional<std::uint64_t> parse_byte_size(std::string_view text);

// "1.50 GiB"-style text with binary units (B, KiB, MiB, GiB, TiB), for budgets and buffers.
std::string format_binary_bytes(std::uint64_t bytes);

// "31.4 GB"-style text with decimal units (10^9), as the ZeRO paper and the seeds quote state
// sizes.
std::string format_decimal_bytes(double bytes);

}  // namespace strata::runtime
