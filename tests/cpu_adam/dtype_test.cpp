// Proves bf16/fp16 conversions round to nearest even exactly, scalar and SIMD alike.
#include "cpu_adam/dtype.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/cast.hpp"
#include "tests/cpu_adam/test_support.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata::cpu_adam {
namespace {

using testing::TypedBuffer;

float from_bits(std::uint32_t bits) {
  return std::bit_cast<float>(bits);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f).bits, 0x3F80);             // tie -> even (down)
  EXPECT_EQ(to_bf16(1.0f + 3 * 0x1p-8f).bits, 0x3F82);         // tie -> even (up)
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f + 0x1p-20f).bits, 0x3F81);  // above the tie
  EXPECT_EQ(to_bf16(-2.0f).bits, 0xC000);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7F80);  // overflow -> inf
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7F80);
  EXPECT_EQ(to_bf16(from_bits(0x0000'8000u)).bits, 0x0000);  // denormal tie -> even 0
  EXPECT_EQ(to_bf16(from_bits(0x0001'8000u)).bits, 0x0002);  // denormal tie -> even up
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(to_float(to_bf16(from_bits(0x7F80'0001u)))));  // payload only in low bits
  EXPECT_EQ(to_float(Bf16{0x3FC0}), 1.5f);
}

TEST(Bf16, MatchesDistanceBasedReference) {
  const std::uint64_t seed = testing::test_seed(7);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int k = 0; k < 2'000'000; ++k) {
    std::uint32_t bits = static_cast<std::uint32_t>(rng());
    if (k % 4 == 0) bits = (bits & 0xFFFF'0000u) | 0x8000u;  // exact ties
    const float value = from_bits(bits);
    ASSERT_EQ(to_bf16(value).bits, testing::reference_bf16_bits(value)) << std::hex << bits;
  }
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(to_fp16(1.0f).bits, 0x3C00);
  EXPECT_EQ(to_fp16(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(to_fp16(65519.99f).bits, 0x7BFF);
  EXPECT_EQ(to_fp16(65520.0f).bits, 0x7C00);  // tie above the max -> even -> inf
  EXPECT_EQ(to_fp16(0x1p-24f).bits, 0x0001);
  EXPECT_EQ(to_fp16(0x1p-25f).bits, 0x0000);  // tie -> even 0
  EXPECT_EQ(to_fp16(1.5f * 0x1p-25f).bits, 0x0001);
  EXPECT_EQ(to_fp16(3 * 0x1p-25f).bits, 0x0002);  // 1.5 units: tie -> even 2
  EXPECT_EQ(to_fp16(-0.0f).bits, 0x8000);
  EXPECT_EQ(to_fp16(0x1p-14f).bits, 0x0400);
  EXPECT_EQ(to_fp16(0x1p-14f - 0x1p-26f).bits, 0x0400);  // rounds up into the normals
  EXPECT_EQ(to_float(Fp16{0x0001}), 0x1p-24f);
  EXPECT_EQ(to_float(Fp16{0xFBFF}), -65504.0f);
  EXPECT_TRUE(std::isinf(to_float(Fp16{0x7C00})));
  EXPECT_TRUE(std::isnan(to_float(Fp16{0x7C01})));
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t f16c_from_float(float value) {
  return static_cast<std::uint16_t>(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float f16c_to_float(std::uint16_t bits) {
  return _cvtsh_ss(bits);
}
bool have_f16c() {
  return __builtin_cpu_supports("f16c");
}
#endif

TEST(Fp16, ToFloatMatchesF16cExhaustively) {
#if defined(__x86_64__)
  if (!have_f16c()) GTEST_SKIP() << "CPU has no F16C";
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float expected = f16c_to_float(static_cast<std::uint16_t>(h));
    const float actual = to_float(Fp16{static_cast<std::uint16_t>(h)});
    ASSERT_EQ(std::bit_cast<std::uint32_t>(actual), std::bit_cast<std::uint32_t>(expected))
        << std::hex << h;
  }
#else
  GTEST_SKIP() << "F16C is x86 only";
#endif
}

TEST(Fp16, FromFloatMatchesF16c) {
#if defined(__x86_64__)
  if (!have_f16c()) GTEST_SKIP() << "CPU has no F16C";
  // Every fp32 exponent and sign, with the low 13 bits at each rounding boundary...
  for (std::uint32_t high = 0; high < (1u << 19); ++high) {
    for (std::uint32_t low : {0x0000u, 0x0001u, 0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu}) {
      const float value = from_bits((high << 13) | low);
      ASSERT_EQ(to_fp16(value).bits, f16c_from_float(value)) << std::hex << ((high << 13) | low);
    }
  }
  // ...and every fp32 in the fp16 subnormal range, where the boundary moves with the exponent.
  for (std::uint32_t bits = 0x3300'0000u; bits < 0x3880'0000u; bits += 3) {
    for (std::uint32_t sign : {0u, 0x8000'0000u}) {
      const float value = from_bits(bits | sign);
      ASSERT_EQ(to_fp16(value).bits, f16c_from_float(value)) << std::hex << (bits | sign);
    }
  }
#else
  GTEST_SKIP() << "F16C is x86 only";
#endif
}

class CastKernels : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (!simd_level_available(GetParam())) GTEST_SKIP() << "level not supported by this CPU";
  }
};

TEST_P(CastKernels, ConvertAndScaleMatchScalarHelpers) {
  const std::uint64_t seed = testing::test_seed(11);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  tbb::task_arena arena(2);
  ExecOptions options;
  options.simd_level = GetParam();
  options.chunk_elems = 37;  // odd chunks put tails everywhere
  const Dtype dtypes[] = {Dtype::kFp32, Dtype::kBf16, Dtype::kFp16};
  for (std::size_t len : {0u, 1u, 3u, 15u, 16u, 17u, 33u, 49u, 1000u}) {
    for (std::size_t offset = 0; offset < 3; ++offset) {
      for (Dtype from : dtypes) {
        TypedBuffer source(from, len, offset);
        for (std::size_t i = 0; i < len; ++i) {
          source.set(i, testing::random_value(rng, -30, 20, true));
        }
        for (Dtype to : dtypes) {
          TypedBuffer destination(to, len, (offset + 1) % 3);
          convert(source.cspan(), destination.span(), arena, options);
          ASSERT_TRUE(destination.guards_intact()) << "convert wrote outside its span";
          TypedBuffer expected(to, len);
          for (std::size_t i = 0; i < len; ++i) expected.set(i, source.get(i));
          for (std::size_t i = 0; i < len; ++i) {
            ASSERT_EQ(destination.bits(i), expected.bits(i))
                << dtype_name(from) << "->" << dtype_name(to) << " len=" << len << " i=" << i;
          }
        }
        TypedBuffer scaled(from, len, offset);
        for (std::size_t i = 0; i < len; ++i) scaled.set(i, source.get(i));
        scale_in_place(scaled.span(), 0.37f, arena, options);
        ASSERT_TRUE(scaled.guards_intact()) << "scale wrote outside its span";
        for (std::size_t i = 0; i < len; ++i) {
          TypedBuffer one(from, 1);
          one.set(0, source.get(i) * 0.37f);
          ASSERT_EQ(scaled.bits(i), one.bits(0)) << "scale " << dtype_name(from) << " i=" << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, CastKernels,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512),
                         [](const ::testing::TestParamInfo<SimdLevel>& param_info) {
                           return std::string(simd_level_name(param_info.param));
                         });

TEST(SimdLevels, ScalarAlwaysAvailableAndBestIsLast) {
  const auto levels = available_simd_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), SimdLevel::kScalar);
  EXPECT_EQ(levels.back(), best_simd_level());
  for (SimdLevel level : levels) EXPECT_EQ(parse_simd_level(simd_level_name(level)), level);
  EXPECT_FALSE(parse_simd_level("avx9").has_value());
}

TEST(Dtypes, NamesRoundTrip) {
  for (Dtype dtype : {Dtype::kFp32, Dtype::kBf16, Dtype::kFp16}) {
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
  }
  EXPECT_FALSE(parse_dtype("fp8").has_value());
  EXPECT_EQ(dtype_bytes(Dtype::kBf16), 2u);
}

}  // namespace
}  // namespace strata::cpu_adam
