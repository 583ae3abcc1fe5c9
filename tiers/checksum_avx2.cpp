// xxHash's XXH3 for AVX2: this file alone is compiled with -mavx2 (see CMakeLists.txt), and
// XXH_INLINE_ALL makes every xxHash symbol here private to it, so nothing else links this copy.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace strata::tiers::detail {

std::uint64_t xxh3_avx2(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace strata::tiers::detail
