// Proves the state codecs' round-trip error stays inside bounds computed here in float64 (int8: the
// decoded value is one of the two codes bracketing the true one; bf16: half an ulp), that encoding
// a decoded state gives its bytes back, and that every SIMD level and thread count gives the same
// bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/simd_level.hpp"
#include "cpu_adam/state_format.hpp"
#include "tests/cpu_adam/test_support.hpp"

namespace strata::cpu_adam {
namespace {

// Three blocks and a short one; magnitudes over ~10 decades, so every block holds both its
// absmax and values that fall to the smallest codes.
std::vector<float> random_moment(MomentKind moment, std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(-22.0, 0.0);
  std::uniform_real_distribution<double> block_scale(-8.0, 2.0);
  std::vector<float> values(count);
  double scale = 1;
  for (std::size_t i = 0; i < count; ++i) {
    if (i % kQuantBlockElems == 0) scale = std::exp2(block_scale(rng));
    double magnitude = scale * std::exp2(exponent(rng));
    if (i % 97 == 0) magnitude = 0;
    const bool negative = moment == MomentKind::kExpAvg && (rng() & 1);
    values[i] = static_cast<float>(negative ? -magnitude : magnitude);
  }
  return values;
}

// The code value at code position c in [0, max_code] (float64): what decoding should give.
double code_value(MomentKind moment, double scale, double c) {
  if (moment == MomentKind::kExpAvg) return scale * (c / 127) * (c / 127);
  const double t = c / 255;
  return scale * t * t * t * t;
}

TEST(StateFormat, Int8RoundTripStaysBetweenTheBracketingCodes) {
  const std::uint64_t seed = testing::test_seed(19);
  tbb::task_arena arena(2);
  for (MomentKind moment : {MomentKind::kExpAvg, MomentKind::kExpAvgSq}) {
    const std::size_t count = 3 * kQuantBlockElems + 333;
    const std::vector<float> values = random_moment(moment, count, seed);
    std::vector<std::byte> encoded(state_bytes(StateDType::kInt8, count));
    ASSERT_EQ(encoded.size(), 4 * kQuantBlockBytes);
    encode_state(StateDType::kInt8, moment, values.data(), count, encoded.data(), arena);
    std::vector<float> decoded(count);
    decode_state(StateDType::kInt8, moment, encoded.data(), count, decoded.data(), arena);
    const double max_code = moment == MomentKind::kExpAvg ? 127 : 255;
    double sum_relative_error = 0;
    std::size_t large = 0;
    for (std::size_t b = 0; b * kQuantBlockElems < count; ++b) {
      const std::size_t first = b * kQuantBlockElems;
      const std::size_t last = std::min(count, first + kQuantBlockElems);
      double absmax = 0;
      for (std::size_t i = first; i < last; ++i)
        absmax = std::max(absmax, std::fabs(double{values[i]}));
      float stored_scale;
      std::memcpy(&stored_scale, encoded.data() + b * kQuantBlockBytes, sizeof(float));
      ASSERT_EQ(double{stored_scale}, absmax) << "block " << b << " " << testing::seed_note(seed);
      for (std::size_t i = first; i < last; ++i) {
        const double x = std::fabs(double{values[i]});
        const double position = moment == MomentKind::kExpAvg
                                    ? max_code * std::sqrt(x / absmax)
                                    : max_code * std::sqrt(std::sqrt(x / absmax));
        const double low = code_value(moment, absmax, std::floor(position));
        const double high =
            code_value(moment, absmax, std::min(max_code, std::floor(position) + 1));
        const double slack = 1e-6 * absmax;  // fp32 arithmetic in the codec
        const double got = std::fabs(double{decoded[i]});
        ASSERT_GE(got, low - slack) << "element " << i << " " << testing::seed_note(seed);
        ASSERT_LE(got, high + slack) << "element " << i << " " << testing::seed_note(seed);
        ASSERT_TRUE(values[i] == 0 || decoded[i] == 0 ||
                    std::signbit(values[i]) == std::signbit(decoded[i]));
        if (x > 1e-2 * absmax) {
          sum_relative_error += std::fabs(got - x) / x;
          ++large;
        }
      }
    }
    // Values within two decades of the block's absmax: a few percent at most on average.
    EXPECT_LT(sum_relative_error / static_cast<double>(large), 0.03);
    // Encoding the decoded state gives the same bytes (checkpoint load keeps the state as it was).
    std::vector<std::byte> again(encoded.size());
    encode_state(StateDType::kInt8, moment, decoded.data(), count, again.data(), arena);
    EXPECT_EQ(again, encoded) << testing::seed_note(seed);
  }
}

TEST(StateFormat, Bf16RoundTripIsWithinHalfAnUlp) {
  const std::uint64_t seed = testing::test_seed(20);
  tbb::task_arena arena(1);
  const std::size_t count = 2 * kQuantBlockElems + 7;
  const std::vector<float> values = random_moment(MomentKind::kExpAvg, count, seed);
  std::vector<std::byte> encoded(state_bytes(StateDType::kBf16, count));
  ASSERT_EQ(encoded.size(), 2 * count);
  encode_state(StateDType::kBf16, MomentKind::kExpAvg, values.data(), count, encoded.data(), arena);
  std::vector<float> decoded(count);
  decode_state(StateDType::kBf16, MomentKind::kExpAvg, encoded.data(), count, decoded.data(),
               arena);
  for (std::size_t i = 0; i < count; ++i) {
    const double x = values[i];
    ASSERT_LE(std::fabs(double{decoded[i]} - x), std::ldexp(std::fabs(x), -8) + 1e-45)
        << "element " << i << " " << testing::seed_note(seed);
  }
}

TEST(StateFormat, BytesAreTheSameForEverySimdLevelAndThreadCount) {
  const std::uint64_t seed = testing::test_seed(21);
  const std::size_t count = 5 * kQuantBlockElems + 17;
  for (StateDType dtype : {StateDType::kBf16, StateDType::kInt8}) {
    for (MomentKind moment : {MomentKind::kExpAvg, MomentKind::kExpAvgSq}) {
      const std::vector<float> values = random_moment(moment, count, seed);
      std::vector<std::byte> reference;
      for (SimdLevel level : available_simd_levels()) {
        for (int threads : {1, 3}) {
          tbb::task_arena arena(threads);
          ExecOptions options;
          options.simd_level = level;
          options.chunk_elems = 2 * kQuantBlockElems;
          std::vector<std::byte> encoded(state_bytes(dtype, count));
          encode_state(dtype, moment, values.data(), count, encoded.data(), arena, options);
          std::vector<float> decoded(count);
          decode_state(dtype, moment, encoded.data(), count, decoded.data(), arena, options);
          std::vector<std::byte> decoded_bytes(count * sizeof(float));
          std::memcpy(decoded_bytes.data(), decoded.data(), decoded_bytes.size());
          encoded.insert(encoded.end(), decoded_bytes.begin(), decoded_bytes.end());
          if (reference.empty()) reference = encoded;
          ASSERT_EQ(encoded, reference) << state_dtype_name(dtype) << " level "
                                        << simd_level_name(level) << " threads " << threads;
        }
      }
    }
  }
}

TEST(StateFormat, SizesAndNames) {
  EXPECT_EQ(kQuantBlockBytes * 4, 4096u);  // four blocks per O_DIRECT page
  EXPECT_EQ(state_bytes(StateDType::kInt8, 0), 0u);
  EXPECT_EQ(state_bytes(StateDType::kInt8, 1), kQuantBlockBytes);
  EXPECT_EQ(state_bytes(StateDType::kInt8, kQuantBlockElems), kQuantBlockBytes);
  EXPECT_EQ(state_bytes(StateDType::kInt8, kQuantBlockElems + 1), 2 * kQuantBlockBytes);
  EXPECT_EQ(state_bytes(StateDType::kFp32, 10), 40u);
  EXPECT_EQ(state_bytes(StateDType::kBf16, 10), 20u);
  for (StateDType dtype : {StateDType::kFp32, StateDType::kBf16, StateDType::kInt8}) {
    EXPECT_EQ(parse_state_dtype(state_dtype_name(dtype)), dtype);
  }
  EXPECT_FALSE(parse_state_dtype("fp16").has_value());
}

}  // namespace
}  // namespace strata::cpu_adam
