// Proves that size strings parse to the bytes docs/config.md promises and that bad ones are
// refused.
#include "runtime/config/byte_size.hpp"

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

TEST(ByteSize, ParsesBinaryAndDecimalSuffixes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("512k"), 512u * 1024);
  EXPECT_EQ(parse_byte_size("512K"), 512u * 1024);
  EXPECT_EQ(parse_byte_size("1MiB"), 1024u * 1024);
  EXPECT_EQ(parse_byte_size("64GiB"), 64ull << 30);
  EXPECT_EQ(parse_byte_size("2T"), 2ull << 40);
  EXPECT_EQ(parse_byte_size("3GB"), 3'000'000'000ull);
  EXPECT_EQ(parse_byte_size("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_byte_size(" 8 MiB "), 8ull << 20);
  EXPECT_EQ(parse_byte_size("0"), 0u);
}

TEST(ByteSize, RefusesMalformedText) {
  for (const char* bad : {"", "GiB", "-1", "12 parsecs", "1.2.3M", "0.3B", "99999999999999999999",
                          "20000000TiB", "1e9"}) {
    EXPECT_FALSE(parse_byte_size(bad).has_value()) << "accepted '" << bad << "'";
  }
}

TEST(ByteSize, FormatsBothUnitSystems) {
  EXPECT_EQ(format_binary_bytes(512), "512 B");
  EXPECT_EQ(format_binary_bytes(3ull << 29), "1.50 GiB");
  EXPECT_EQ(format_decimal_bytes(31.40625e9), "31.4 GB");
  EXPECT_EQ(format_decimal_bytes(1.875e9), "1.9 GB");
}

}  // namespace
}  // namespace strata::runtime
