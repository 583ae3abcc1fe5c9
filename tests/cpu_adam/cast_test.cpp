// Proves the SIMD convert and scale kernels give exactly the bits of the scalar conversions
// (base/float16.hpp, proven in tests/base/float16_test.cpp) at every SIMD level.
#include "cpu_adam/cast.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include <oneapi/tbb/task_arena.h>

#include "tests/cpu_adam/test_support.hpp"

namespace strata::cpu_adam {
namespace {

using testing::TypedBuffer;

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
  const DType dtypes[] = {DType::kFp32, DType::kBf16, DType::kFp16};
  for (std::size_t len : {0u, 1u, 3u, 15u, 16u, 17u, 33u, 49u, 1000u}) {
    for (std::size_t offset = 0; offset < 3; ++offset) {
      for (DType from : dtypes) {
        TypedBuffer source(from, len, offset);
        for (std::size_t i = 0; i < len; ++i) {
          source.set(i, testing::random_value(rng, -30, 20, true));
        }
        for (DType to : dtypes) {
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

}  // namespace
}  // namespace strata::cpu_adam
