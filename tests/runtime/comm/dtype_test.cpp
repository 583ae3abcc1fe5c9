// Proves reduce_rows accumulates in fp32 in row order and rounds once, bit for bit (the rounding
// itself is proven in tests/base/float16_test.cpp).
#include "runtime/comm/reduction.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/base/float16_reference.hpp"

namespace strata::runtime::comm {
namespace {

using float16_reference::reference_bf16_bits;

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
  const std::vector<std::vector<Bf16>> rows = {
      {to_bf16(1.0f)}, {to_bf16(0x1p-9f)}, {to_bf16(0x1p-9f)}, {to_bf16(0x1p-9f)}};
  auto bytes = as_rows(rows);
  Bf16 out;
  reduce_rows(DType::kBf16, ReduceOp::kSum, bytes.data(), sizeof(Bf16), 4, 1,
              reinterpret_cast<std::byte*>(&out));
  EXPECT_EQ(out, to_bf16(1.0f + 0x1p-7f));
}

TEST(DtypeTest, Fp16AvgDividesTheFp32SumOnce) {
  const std::vector<std::vector<Fp16>> rows = {
      {to_fp16(1.0f)}, {to_fp16(0x1p-11f)}, {to_fp16(0x1p-11f)}};
  auto bytes = as_rows(rows);
  Fp16 out;
  reduce_rows(DType::kFp16, ReduceOp::kAvg, bytes.data(), sizeof(Fp16), 3, 1,
              reinterpret_cast<std::byte*>(&out));
  EXPECT_EQ(out, to_fp16((1.0f + 0x1p-10f) / 3.0f));
}

template <typename T>
void check_random_reduction(DType dtype, ReduceOp op, std::uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> distribution(-4.0f, 4.0f);
  for (std::size_t row_count = 1; row_count <= 5; ++row_count) {
    const std::size_t count = 1 + random() % 1500;  // crosses the 512-element blocks unevenly
    std::vector<std::vector<T>> rows(row_count, std::vector<T>(count));
    for (auto& row : rows) {
      for (auto& element : row) {
        if constexpr (std::same_as<T, float>) element = distribution(random);
        if constexpr (std::same_as<T, Bf16>) element = to_bf16(distribution(random));
        if constexpr (std::same_as<T, Fp16>) element = to_fp16(distribution(random));
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
      } else if constexpr (std::same_as<T, Bf16>) {
        expected_bits = reference_bf16_bits(accumulated);
        actual_bits = out[i].bits;
      } else {
        expected_bits = to_fp16(accumulated).bits;
        actual_bits = out[i].bits;
      }
      ASSERT_EQ(actual_bits, expected_bits) << dtype_name(dtype) << " " << to_string(op) << " rows "
                                            << row_count << " element " << i << " seed " << seed;
    }
  }
}

TEST(DtypeTest, RandomReductionsMatchTheRankOrderReferenceBitForBit) {
  const std::uint32_t seed = 12345;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    check_random_reduction<float>(DType::kFp32, op, seed);
    check_random_reduction<Bf16>(DType::kBf16, op, seed);
    check_random_reduction<Fp16>(DType::kFp16, op, seed);
  }
}

TEST(DtypeTest, MaxPropagatesNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto& rows : {std::vector<std::vector<float>>{{nan}, {1.0f}},
                           std::vector<std::vector<float>>{{1.0f}, {nan}}}) {
    auto bytes = as_rows(rows);
    float out = 0;
    reduce_rows(DType::kFp32, ReduceOp::kMax, bytes.data(), sizeof(float), 2, 1,
                reinterpret_cast<std::byte*>(&out));
    EXPECT_TRUE(std::isnan(out));
  }
}

TEST(DtypeTest, IntegerSumWrapsAndMaxPicksTheLargest) {
  const std::vector<std::vector<std::uint64_t>> rows = {{~0ull, 3}, {2, 9}, {0, 4}};
  auto bytes = as_rows(rows);
  std::uint64_t out[2];
  reduce_rows(DType::kUint64, ReduceOp::kSum, bytes.data(), 2 * sizeof(std::uint64_t), 3, 2,
              reinterpret_cast<std::byte*>(out));
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[1], 16u);
  reduce_rows(DType::kUint64, ReduceOp::kMax, bytes.data(), 2 * sizeof(std::uint64_t), 3, 2,
              reinterpret_cast<std::byte*>(out));
  EXPECT_EQ(out[0], ~0ull);
  EXPECT_EQ(out[1], 9u);
  EXPECT_FALSE(is_valid_reduction(DType::kUint8, ReduceOp::kAvg));
  EXPECT_TRUE(is_valid_reduction(DType::kBf16, ReduceOp::kAvg));
}

TEST(DtypeTest, OutputMayAliasTheFirstRow) {
  std::vector<std::vector<float>> rows = {std::vector<float>(700, 1.5f),
                                          std::vector<float>(700, 2.0f)};
  auto bytes = as_rows(rows);
  reduce_rows(DType::kFp32, ReduceOp::kSum, bytes.data(), 700 * sizeof(float), 2, 700,
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
