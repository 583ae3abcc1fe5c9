// Proves the bf16/fp16 conversions round to nearest even (against independent references) and that
// reduce_rows accumulates in fp32 in row order and rounds once, bit for bit.
#include "runtime/comm/dtype.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace strata::runtime::comm {
namespace {

// Independent bf16 reference: pick the nearer of the two bf16 neighbours by exact double
// arithmetic, the one with an even mantissa on a tie.
std::uint16_t reference_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto truncated = static_cast<std::uint16_t>(bits >> 16);
  if ((bits & 0xffffu) == 0) return truncated;
  const auto up = static_cast<std::uint16_t>(truncated + 1);  // next in magnitude, same sign
  const double low_value = std::bit_cast<float>(static_cast<std::uint32_t>(truncated) << 16);
  // Past the largest finite bf16 the next neighbour is 2^128 (IEEE overflow rounding), encoded as
  // inf.
  const double high_value = (up & 0x7fffu) == 0x7f80u
                                ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(value))
                                : std::bit_cast<float>(static_cast<std::uint32_t>(up) << 16);
  const double low_distance = std::fabs(static_cast<double>(value) - low_value);
  const double high_distance = std::fabs(high_value - static_cast<double>(value));
  if (low_distance < high_distance) return truncated;
  if (high_distance < low_distance) return up;
  return (truncated & 1u) == 0 ? truncated : up;
}

std::vector<float> interesting_floats(std::uint32_t seed) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               65536.0f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               0x1p-24f,
                               0x1p-25f,
                               0x1.8p-25f,
                               0x1p-26f,
                               0x1.ffcp-15f,
                               0x1.ffep-15f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
  std::mt19937 random(seed);
  for (int i = 0; i < 200000; ++i)
    values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(random())));
  for (int i = 0; i < 100000; ++i) {  // around the fp16 range, where rounding decisions matter
    std::uniform_real_distribution<float> around(-70000.0f, 70000.0f);
    values.push_back(around(random) * std::ldexp(1.0f, static_cast<int>(random() % 30) - 28));
  }
  return values;
}

TEST(DtypeTest, Bf16RoundsToNearestEvenLikeTheReference) {
  const std::uint32_t seed = 20261129;
  for (float value : interesting_floats(seed)) {
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(to_float(to_bf16(value)))) << "seed " << seed;
      continue;
    }
    ASSERT_EQ(to_bf16(value).bits, reference_bf16(value))
        << "value " << std::hexfloat << value << " seed " << seed;
  }
}

TEST(DtypeTest, Bf16TiesGoToEven) {
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f).bits, to_bf16(1.0f).bits);  // tie, 1.0 is even
  EXPECT_EQ(to_bf16(1.0f + 0x1p-7f + 0x1p-8f).bits,
            to_bf16(1.0f + 0x1p-6f).bits);                              // tie, up to even
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80u);  // rounds to infinity
}

TEST(DtypeTest, Bf16ToFloatIsExactForEveryPattern) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const BFloat16 value{static_cast<std::uint16_t>(bits)};
    const float widened = to_float(value);
    if (std::isnan(widened)) continue;
    ASSERT_EQ(to_bf16(widened).bits, bits);
  }
}

#if defined(__FLT16_MAX__)
TEST(DtypeTest, Fp16MatchesTheCompilersFloat16) {
  const std::uint32_t seed = 7;
  for (float value : interesting_floats(seed)) {
    const auto reference = static_cast<_Float16>(value);
    std::uint16_t reference_bits = 0;
    std::memcpy(&reference_bits, &reference, sizeof(reference_bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(to_float(to_fp16(value))));
      continue;
    }
    ASSERT_EQ(to_fp16(value).bits, reference_bits)
        << "value " << std::hexfloat << value << " seed " << seed;
  }
}

TEST(DtypeTest, Fp16ToFloatMatchesTheCompilerForEveryPattern) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto half_bits = static_cast<std::uint16_t>(bits);
    _Float16 reference;
    std::memcpy(&reference, &half_bits, sizeof(reference));
    const float expected = static_cast<float>(reference);
    const float widened = to_float(Float16{half_bits});
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(widened)) << bits;
      continue;
    }
    ASSERT_EQ(std::bit_cast<std::uint32_t>(widened), std::bit_cast<std::uint32_t>(expected))
        << bits;
    ASSERT_EQ(to_fp16(widened).bits, half_bits);
  }
}
#else
TEST(DtypeTest, Fp16MatchesTheCompilersFloat16) {
  GTEST_SKIP() << "compiler has no _Float16";
}
#endif

TEST(DtypeTest, Fp16MidpointsRoundToEven) {
  // Every midpoint between adjacent positive finite fp16 values rounds to the even neighbour.
  for (std::uint16_t bits = 0; bits < 0x7bffu; ++bits) {
    const double low = to_float(Float16{bits});
    const double high = to_float(Float16{static_cast<std::uint16_t>(bits + 1)});
    const auto midpoint = static_cast<float>((low + high) / 2);  // exact in fp32
    const std::uint16_t even = (bits & 1u) == 0 ? bits : static_cast<std::uint16_t>(bits + 1);
    ASSERT_EQ(to_fp16(midpoint).bits, even) << bits;
  }
}

template <typename T>
std::vector<std::byte> as_rows(const std::vector<std::vector<T>>& rows) {
  std::vector<std::byte> bytes(rows.size() * rows[0].size() * sizeof(T));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(bytes.data() + r * rows[0].size() * sizeof(T), rows[r].data(),
                rows[r].size() * sizeof(T));
  }
  return bytes;
}

TEST(DtypeTest, Bf16SumAccumulatesInFp32ThenRoundsOnce) {
  // 1 + 3 * 2^-9: rounding after every addition would stay at 1.0 (each 2^-9 is a quarter ulp);
  // accumulating in fp32 reaches 1.00586 and rounds once, up to 1 + 2^-7.
  const std::vector<std::vector<BFloat16>> rows = {
      {to_bf16(1.0f)}, {to_bf16(0x1p-9f)}, {to_bf16(0x1p-9f)}, {to_bf16(0x1p-9f)}};
  auto bytes = as_rows(rows);
  BFloat16 out;
  reduce_rows(DataType::kBf16, ReduceOp::kSum, bytes.data(), sizeof(BFloat16), 4, 1,
              reinterpret_cast<std::byte*>(&out));
  EXPECT_EQ(out, to_bf16(1.0f + 0x1p-7f));
}

TEST(DtypeTest, Fp16AvgDividesTheFp32SumOnce) {
  const std::vector<std::vector<Float16>> rows = {
      {to_fp16(1.0f)}, {to_fp16(0x1p-11f)}, {to_fp16(0x1p-11f)}};
  auto bytes = as_rows(rows);
  Float16 out;
  reduce_rows(DataType::kFp16, ReduceOp::kAvg, bytes.data(), sizeof(Float16), 3, 1,
              reinterpret_cast<std::byte*>(&out));
  EXPECT_EQ(out, to_fp16((1.0f + 0x1p-10f) / 3.0f));
}

template <typename T>
void check_random_reduction(DataType dtype, ReduceOp op, std::uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> distribution(-4.0f, 4.0f);
  for (std::size_t row_count = 1; row_count <= 5; ++row_count) {
    const std::size_t count = 1 + random() % 1500;  // crosses the 512-element blocks unevenly
    std::vector<std::vector<T>> rows(row_count, std::vector<T>(count));
    for (auto& row : rows) {
      for (auto& element : row) {
        if constexpr (std::same_as<T, float>) element = distribution(random);
        if constexpr (std::same_as<T, BFloat16>) element = to_bf16(distribution(random));
        if constexpr (std::same_as<T, Float16>) element = to_fp16(distribution(random));
      }
    }
    auto bytes = as_rows(rows);
    std::vector<T> out(count);
    reduce_rows(dtype, op, bytes.data(), count * sizeof(T), row_count, count,
                reinterpret_cast<std::byte*>(out.data()));
    for (std::size_t i = 0; i < count; ++i) {
      float accumulated = 0;
      for (std::size_t r = 0; r < row_count; ++r) {
        float value;
        if constexpr (std::same_as<T, float>)
          value = rows[r][i];
        else
          value = to_float(rows[r][i]);
        if (r == 0)
          accumulated = value;
        else
          accumulated = op == ReduceOp::kMax ? std::max(accumulated, value) : accumulated + value;
      }
      if (op == ReduceOp::kAvg) accumulated /= static_cast<float>(row_count);
      std::uint32_t expected_bits;
      std::uint32_t actual_bits;
      if constexpr (std::same_as<T, float>) {
        expected_bits = std::bit_cast<std::uint32_t>(accumulated);
        actual_bits = std::bit_cast<std::uint32_t>(out[i]);
      } else if constexpr (std::same_as<T, BFloat16>) {
        expected_bits = reference_bf16(accumulated);
        actual_bits = out[i].bits;
      } else {
        expected_bits = to_fp16(accumulated).bits;
        actual_bits = out[i].bits;
      }
      ASSERT_EQ(actual_bits, expected_bits) << to_string(dtype) << " " << to_string(op) << " rows "
                                            << row_count << " element " << i << " seed " << seed;
    }
  }
}

TEST(DtypeTest, RandomReductionsMatchTheRankOrderReferenceBitForBit) {
  const std::uint32_t seed = 12345;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    check_random_reduction<float>(DataType::kFp32, op, seed);
    check_random_reduction<BFloat16>(DataType::kBf16, op, seed);
    check_random_reduction<Float16>(DataType::kFp16, op, seed);
  }
}

TEST(DtypeTest, MaxPropagatesNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& rows : {std::vector<std::vector<float>>{{nan}, {1.0f}},
                           std::vector<std::vector<float>>{{1.0f}, {nan}}}) {
    auto bytes = as_rows(rows);
    float out = 0;
    reduce_rows(DataType::kFp32, ReduceOp::kMax, bytes.data(), sizeof(float), 2, 1,
                reinterpret_cast<std::byte*>(&out));
    EXPECT_TRUE(std::isnan(out));
  }
}

TEST(DtypeTest, IntegerSumWrapsAndMaxPicksTheLargest) {
  const std::vector<std::vector<std::uint64_t>> rows = {{~0ull, 3}, {2, 9}, {0, 4}};
  auto bytes = as_rows(rows);
  std::uint64_t out[2];
  reduce_rows(DataType::kUint64, ReduceOp::kSum, bytes.data(), 2 * sizeof(std::uint64_t), 3, 2,
              reinterpret_cast<std::byte*>(out));
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 16u);
  reduce_rows(DataType::kUint64, ReduceOp::kMax, bytes.data(), 2 * sizeof(std::uint64_t), 3, 2,
              reinterpret_cast<std::byte*>(out));
  EXPECT_EQ(out[0], ~0ull);
  EXPECT_EQ(out[1], 9u);
  EXPECT_FALSE(is_valid_reduction(DataType::kUint8, ReduceOp::kAvg));
  EXPECT_TRUE(is_valid_reduction(DataType::kBf16, ReduceOp::kAvg));
}

TEST(DtypeTest, OutputMayAliasTheFirstRow) {
  std::vector<std::vector<float>> rows = {std::vector<float>(700, 1.5f),
                                          std::vector<float>(700, 2.0f)};
  auto bytes = as_rows(rows);
  reduce_rows(DataType::kFp32, ReduceOp::kSum, bytes.data(), 700 * sizeof(float), 2, 700,
              bytes.data());
  float first;
  float last;
  std::memcpy(&first, bytes.data(), sizeof(float));
  std::memcpy(&last, bytes.data() + 699 * sizeof(float), sizeof(float));
  EXPECT_EQ(first, 3.5f);
  EXPECT_EQ(last, 3.5f);
}

}  // namespace
}  // namespace strata::runtime::comm
