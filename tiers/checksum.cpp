#include "tiers/checksum.hpp"

#include <xxhash.h>

namespace strata::tiers {

namespace detail {

#if defined(STRATA_XXH3_AVX2)
std::uint64_t xxh3_avx2(const void* data, std::size_t bytes);  // checksum_avx2.cpp
#endif

std::uint64_t xxh3_library(const void* data, std::size_t bytes) {
  return XXH3_64bits(data, bytes);
}

Xxh3Fn xxh3_avx2_if_built() {
#if defined(STRATA_XXH3_AVX2)
  return &xxh3_avx2;
#else
  return nullptr;
#endif
}

}  // namespace detail

namespace {

struct Path {
  detail::Xxh3Fn fn;
  std::string_view name;
};

Path choose_path() {
#if defined(STRATA_XXH3_AVX2)
  if (__builtin_cpu_supports("avx2")) return {detail::xxh3_avx2_if_built(), "avx2"};
#endif
  return {&detail::xxh3_library, "library"};
}

const Path& path() {
  static const Path chosen = choose_path();
  return chosen;
}

}  // namespace

std::uint64_t xxh3(std::span<const std::byte> bytes) {
  return path().fn(bytes.data(), bytes.size());
}

std::string_view xxh3_path() { return path().name; }

}  // namespace strata::tiers
