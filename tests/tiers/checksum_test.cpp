// tiers::xxh3 against Debian's libxxhash: the AVX2 path must give the library's value for every
// length (XXH3 switches algorithm at 16, 128, 240 bytes and at each 1 KiB stripe block) and
// alignment, or stores written by one build would fail verification under the other.
#include "tiers/checksum.hpp"

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

namespace strata::tiers {
namespace {

std::vector<std::byte> random_bytes(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> bytes(count);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

TEST(Xxh3, TheStoresHashIsTheLibrarysForEveryLengthAndAlignment) {
  const std::vector<std::byte> data = random_bytes((4u << 20) + 64, 7);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 2100; ++n) lengths.push_back(n);
  for (std::size_t n : {4095u, 4096u, 4097u, 65536u, 65537u, 1048576u, 1048577u, 4194304u})
    lengths.push_back(n);
  for (std::size_t offset : {0u, 1u, 7u, 32u, 63u}) {
    for (std::size_t n : lengths) {
      const std::span<const std::byte> piece(data.data() + offset, n);
      ASSERT_EQ(xxh3(piece), detail::xxh3_library(piece.data(), piece.size()))
          << "length " << n << " at offset " << offset << ", path " << xxh3_path();
    }
  }
}

TEST(Xxh3, TheAvx2CopyMatchesTheLibraryWhereTheCpuRunsIt) {
  const detail::Xxh3Fn avx2 = detail::xxh3_avx2_if_built();
  if (avx2 == nullptr) GTEST_SKIP() << "this build has no AVX2 copy (not x86-64)";
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  EXPECT_EQ(xxh3_path(), "avx2");
  for (std::uint32_t seed = 0; seed < 64; ++seed) {
    const std::vector<std::byte> data = random_bytes(1 + seed * 997, seed);
    EXPECT_EQ(avx2(data.data(), data.size()), detail::xxh3_library(data.data(), data.size()))
        << "seed " << seed;
  }
  // A changed byte changes the hash (a checksum that ignored its input would pass the above).
  std::vector<std::byte> data = random_bytes(1 << 20, 99);
  const std::uint64_t before = xxh3(data);
  data[123457] ^= std::byte{1};
  EXPECT_NE(xxh3(data), before);
}

}  // namespace
}  // namespace strata::tiers
