// The NVMe store's checksum: XXH3-64 of a byte range. The value is xxHash's, the same whichever
// code path computes it, so stores written before and after a CPU change read back alike.
//
// Where the CPU has AVX2, it runs xxHash's own AVX2 path (xxhash.h compiled for AVX2 in
// checksum_avx2.cpp: Debian's libxxhash is built for SSE2 only). On 64 MiB of cold memory here it
// hashes about 1.7x the library's rate (28-30 GB/s against 15-17), which is CPU the checksum
// thread no longer takes from the model's compute. `strata tune` measures this same function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace strata::tiers {

std::uint64_t xxh3(std::span<const std::byte> bytes);

// The code path xxh3() takes on this CPU: "avx2" or "library" (libxxhash as Debian builds it).
std::string_view xxh3_path();

namespace detail {
// The library's XXH3_64bits, and the AVX2 copy (null where the build has none); for the tests
// that hold one to the other.
std::uint64_t xxh3_library(const void* data, std::size_t bytes);
using Xxh3Fn = std::uint64_t (*)(const void*, std::size_t);
Xxh3Fn xxh3_avx2_if_built();
}  // namespace detail

}  // namespace strata::tiers
