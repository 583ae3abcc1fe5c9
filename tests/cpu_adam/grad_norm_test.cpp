// Proves the norm pre-pass is accurate, flags every inf/NaN, and is bitwise deterministic.
#include "cpu_adam/grad_norm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "tests/cpu_adam/test_support.hpp"

namespace strata::cpu_adam {
namespace {

using testing::TypedBuffer;

long double reference_sum(const TypedBuffer& grad) {
  long double sum = 0;
  for (std::size_t i = 0; i < grad.count(); ++i) {
    const long double v = grad.get(i);
    sum += v * v;
  }
  return sum;
}

TypedBuffer random_grad(DType dtype, std::size_t count, std::size_t offset, std::mt19937_64& rng) {
  TypedBuffer grad(dtype, count, offset);
  for (std::size_t i = 0; i < count; ++i) {
    float g = testing::random_value(rng, -20, 6, true);
    if (dtype == DType::kFp16) g = std::clamp(g, -6e4f, 6e4f);
    grad.set(i, g);
  }
  return grad;
}

const std::size_t kLengths[] = {0,
                                1,
                                15,
                                16,
                                17,
                                47,
                                kNormBlockElems - 1,
                                kNormBlockElems + 1,
                                9 * kNormBlockElems + 5,
                                40 * kNormBlockElems + 77};

class GradNorm : public ::testing::TestWithParam<DType> {};

// Relative tolerance 1e-10: each double lane adds at most n terms (n <= 1e6 here), each add erring
// by at most 2^-53 of the running sum, so the error is below 1e6 * 1.1e-16 ~ 1.1e-10 of the sum in
// the worst case and ~1e-13 typically; all squares are positive, so no cancellation.
TEST_P(GradNorm, MatchesLongDoubleReference) {
  const std::uint64_t seed = testing::test_seed(5);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  tbb::task_arena arena(2);
  for (std::size_t len : kLengths) {
    for (std::size_t offset : {0u, 1u}) {
      const TypedBuffer grad = random_grad(GetParam(), len, offset, rng);
      GradNormAccumulator accumulator;
      accumulator.add(grad.cspan(), arena);
      const long double expected = reference_sum(grad);
      EXPECT_NEAR(accumulator.sum_of_squares(), static_cast<double>(expected),
                  1e-10 * static_cast<double>(expected))
          << "len=" << len;
      EXPECT_FALSE(accumulator.non_finite());
      EXPECT_DOUBLE_EQ(accumulator.norm(), std::sqrt(accumulator.sum_of_squares()));
    }
  }
}

TEST_P(GradNorm, SameBitsForEveryThreadCountLevelAndFeedingPath) {
  const std::uint64_t seed = testing::test_seed(6);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  std::vector<TypedBuffer> grads;
  for (std::size_t len : kLengths) grads.push_back(random_grad(GetParam(), len, len % 3, rng));
  std::vector<ConstTypedSpan> spans;
  for (const auto& g : grads) spans.push_back(g.cspan());

  ExecOptions scalar;
  scalar.simd_level = SimdLevel::kScalar;
  GradNormAccumulator reference(scalar);
  for (const auto& span : spans) reference.add_serial(span);

  for (SimdLevel level : available_simd_levels()) {
    ExecOptions options;
    options.simd_level = level;
    for (int threads = 1; threads <= 8; ++threads) {
      tbb::task_arena arena(threads);
      GradNormAccumulator all_at_once(options);
      all_at_once.add(spans, arena);
      GradNormAccumulator one_by_one(options);
      for (const auto& span : spans) one_by_one.add(span, arena);
      const std::string label =
          std::string(simd_level_name(level)) + " threads=" + std::to_string(threads);
      EXPECT_EQ(all_at_once.sum_of_squares(), reference.sum_of_squares()) << label;
      EXPECT_EQ(one_by_one.sum_of_squares(), reference.sum_of_squares()) << label;
    }
  }
}

TEST_P(GradNorm, FlagsInfAndNanAnywhere) {
  tbb::task_arena arena(2);
  const float bad_values[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::nanf("")};
  for (SimdLevel level : available_simd_levels()) {
    ExecOptions options;
    options.simd_level = level;
    for (std::size_t len : {1u, 17u, 100u, 3u * 16384u + 9u}) {
      for (std::size_t position : {std::size_t{0}, len / 2, len - 1}) {
        for (float bad : bad_values) {
          TypedBuffer grad(GetParam(), len, 1);
          for (std::size_t i = 0; i < len; ++i) grad.set(i, 0.5f);
          grad.set(position, bad);
          GradNormAccumulator accumulator(options);
          accumulator.add(grad.cspan(), arena);
          EXPECT_TRUE(accumulator.non_finite())
              << simd_level_name(level) << " len=" << len << " at " << position << " " << bad;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryDtype, GradNorm,
                         ::testing::Values(DType::kFp32, DType::kBf16, DType::kFp16),
                         [](const auto& param_info) {
                           return std::string(dtype_name(param_info.param));
                         });

TEST(GradNormManySpans, ParallelOverSpansGivesTheSerialBits) {
  const std::uint64_t seed = testing::test_seed(8);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> length(0, 5000);
  std::vector<TypedBuffer> grads;
  for (int k = 0; k < 300; ++k) {
    const DType dtype = static_cast<DType>(k % 3);
    grads.push_back(random_grad(dtype, length(rng), static_cast<std::size_t>(k % 2), rng));
  }
  grads.push_back(random_grad(DType::kFp32, 20 * kNormBlockElems + 3, 0, rng));  // one big span
  std::vector<ConstTypedSpan> spans;
  for (const auto& g : grads) spans.push_back(g.cspan());
  for (int threads : {1, 2, 5}) {
    tbb::task_arena arena(threads);
    GradNormAccumulator parallel;
    parallel.add(spans, arena);
    parallel.add(std::span<const ConstTypedSpan>(spans).first(7), arena);  // reuses its buffer
    GradNormAccumulator expected;
    for (const auto& span : spans) expected.add_serial(span);
    for (const auto& span : std::span<const ConstTypedSpan>(spans).first(7)) {
      expected.add_serial(span);
    }
    EXPECT_EQ(parallel.sum_of_squares(), expected.sum_of_squares()) << "threads=" << threads;
  }
}

TEST(GradNormEdges, LargestFiniteValuesDoNotOverflow) {
  tbb::task_arena arena(1);
  std::vector<float> grad(1000, std::numeric_limits<float>::max());
  GradNormAccumulator accumulator;
  accumulator.add(std::span<const float>(grad), arena);
  EXPECT_FALSE(accumulator.non_finite());
  EXPECT_NEAR(accumulator.norm(), std::sqrt(1000.0) * std::numeric_limits<float>::max(), 1e30);
}

TEST(GradNormEdges, ResetAndDenormals) {
  tbb::task_arena arena(1);
  std::vector<float> grad(33, 1e-40f);
  GradNormAccumulator accumulator;
  accumulator.add(std::span<const float>(grad), arena);
  const double one = static_cast<double>(1e-40f);
  EXPECT_DOUBLE_EQ(accumulator.sum_of_squares(), 33 * one * one);
  accumulator.reset();
  EXPECT_EQ(accumulator.sum_of_squares(), 0.0);
  EXPECT_FALSE(accumulator.non_finite());
}

TEST(ClipCoefficient, FollowsTorchClipGradNorm) {
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0);
  EXPECT_EQ(clip_coefficient(std::nan(""), 1.0), 0.0);
}

}  // namespace
}  // namespace strata::cpu_adam
