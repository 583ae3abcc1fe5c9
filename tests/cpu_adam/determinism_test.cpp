// Proves step() is bitwise identical across threads 1..8, chunkings and SIMD levels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/grad_norm.hpp"
#include "cpu_adam/optimizer.hpp"
#include "tests/cpu_adam/test_support.hpp"

namespace strata::cpu_adam {
namespace {

using testing::TypedBuffer;

constexpr std::size_t kCount = 3 * 4096 + 21;

struct RunResult {
  std::vector<float> master, exp_avg, exp_avg_sq;
  TypedBuffer out{DType::kBf16, 0};
};

// Two steps from the same seeded state; returns the state after them.
RunResult run(Algorithm algorithm, DType grad_dtype, DType out_dtype, int threads,
              const ExecOptions& options, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  RunResult r;
  r.master.resize(kCount);
  r.exp_avg.resize(kCount);
  r.exp_avg_sq.resize(kCount);
  r.out = TypedBuffer(out_dtype, kCount, 1);
  TypedBuffer grad(grad_dtype, kCount, 3);
  for (std::size_t i = 0; i < kCount; ++i) {
    r.master[i] = testing::random_value(rng, -6, 2, true);
    r.exp_avg[i] = testing::random_value(rng, -12, -4, true);
    r.exp_avg_sq[i] = std::fabs(testing::random_value(rng, -24, -8, true));
  }
  tbb::task_arena arena(threads);
  for (int step = 1; step <= 2; ++step) {
    for (std::size_t i = 0; i < kCount; ++i) {
      float g = testing::random_value(rng, -16, 4, true);
      if (grad_dtype == DType::kFp16) g = std::clamp(g, -6e4f, 6e4f);
      grad.set(i, g);
    }
    Hyperparams h;
    h.algorithm = algorithm;
    h.step = step;
    h.lr = 1e-3 * step;
    h.weight_decay = 0.01;
    h.beta2 = algorithm == Algorithm::kLion ? 0.99 : 0.999;
    ParamSpans spans;
    spans.master = r.master;
    spans.exp_avg = r.exp_avg;
    spans.exp_avg_sq = r.exp_avg_sq;
    spans.grad = grad.cspan();
    spans.param_out = r.out.span();
    cpu_adam::step(h, spans, GradScaling{512.0, 0.5}, arena, options);
  }
  return r;
}

void expect_same(const RunResult& expected, const RunResult& actual, const std::string& label) {
  for (std::size_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(testing::same_value(expected.master[i], actual.master[i]))
        << label << " master i=" << i;
    ASSERT_TRUE(testing::same_value(expected.exp_avg[i], actual.exp_avg[i]))
        << label << " exp_avg i=" << i;
    ASSERT_TRUE(testing::same_value(expected.exp_avg_sq[i], actual.exp_avg_sq[i]))
        << label << " exp_avg_sq i=" << i;
  }
  ASSERT_TRUE(expected.out.same_bytes(actual.out)) << label << " param_out";
}

std::string determinism_name(
    const ::testing::TestParamInfo<std::tuple<Algorithm, DType, DType>>& param_info) {
  static const char* kNames[] = {"AdamW", "Adam", "Adagrad", "Lion"};
  return std::string(kNames[static_cast<int>(std::get<0>(param_info.param))]) + "_grad" +
         std::string(dtype_name(std::get<1>(param_info.param))) + "_out" +
         std::string(dtype_name(std::get<2>(param_info.param)));
}

class StepDeterminism : public ::testing::TestWithParam<std::tuple<Algorithm, DType, DType>> {};

TEST_P(StepDeterminism, SameBitsForEveryThreadCountChunkingAndLevel) {
  const auto [algorithm, grad_dtype, out_dtype] = GetParam();
  const std::uint64_t seed = testing::test_seed(2024);
  SCOPED_TRACE(testing::seed_note(seed));
  ExecOptions scalar;
  scalar.simd_level = SimdLevel::kScalar;
  const RunResult reference = run(algorithm, grad_dtype, out_dtype, 1, scalar, seed);
  for (SimdLevel level : available_simd_levels()) {
    for (int threads = 1; threads <= 8; ++threads) {
      for (std::size_t chunk : {std::size_t{1000}, std::size_t{4096 + 5}, kDefaultChunkElems}) {
        if (chunk == 1000 && threads % 4 != 1) continue;  // keep the matrix quick
        ExecOptions options;
        options.simd_level = level;
        options.chunk_elems = chunk;
        const std::string label = std::string(simd_level_name(level)) +
                                  " threads=" + std::to_string(threads) +
                                  " chunk=" + std::to_string(chunk);
        expect_same(reference, run(algorithm, grad_dtype, out_dtype, threads, options, seed),
                    label);
        if (HasFatalFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, StepDeterminism,
    ::testing::Combine(::testing::Values(Algorithm::kAdamW, Algorithm::kAdam, Algorithm::kAdagrad,
                                         Algorithm::kLion),
                       ::testing::Values(DType::kFp32, DType::kBf16, DType::kFp16),
                       ::testing::Values(DType::kBf16, DType::kFp16)),
    determinism_name);

}  // namespace
}  // namespace strata::cpu_adam

namespace strata::cpu_adam {
namespace {

// The benchmark's memory bound must touch the state without changing it, at every level.
TEST(StreamBound, LeavesStateUnchangedAtEveryLevel) {
  std::mt19937_64 rng(testing::test_seed(3));
  tbb::task_arena arena(2);
  for (SimdLevel level : available_simd_levels()) {
    for (DType grad_dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{31}, std::size_t{40'000}}) {
        std::vector<float> master(count), exp_avg(count), exp_avg_sq(count);
        for (std::size_t i = 0; i < count; ++i) {
          master[i] = testing::random_value(rng, -10, 10, true);
          exp_avg[i] = testing::random_value(rng, -10, 10, true);
          exp_avg_sq[i] = testing::random_value(rng, -10, 10, true);
        }
        const std::vector<float> master0 = master, exp_avg0 = exp_avg, exp_avg_sq0 = exp_avg_sq;
        TypedBuffer grad(grad_dtype, count, 1);
        TypedBuffer out(DType::kBf16, count, 1);
        ParamSpans spans;
        spans.master = master;
        spans.exp_avg = exp_avg;
        spans.exp_avg_sq = exp_avg_sq;
        spans.grad = grad.cspan();
        spans.param_out = out.span();
        ExecOptions options;
        options.simd_level = level;
        stream_bound(spans, arena, options);
        EXPECT_TRUE(testing::same_bits(master, master0)) << simd_level_name(level);
        EXPECT_TRUE(testing::same_bits(exp_avg, exp_avg0));
        EXPECT_TRUE(testing::same_bits(exp_avg_sq, exp_avg_sq0));
      }
    }
  }
}

}  // namespace
}  // namespace strata::cpu_adam

namespace strata::cpu_adam {
namespace {

// The Engine's use: norm fed sub-group by sub-group, then one step per sub-group with the
// resulting clip; the state must match one step over the whole buffer, bit for bit.
TEST(SubGroups, SplitStepsGiveTheSameBitsAsOneSpan) {
  const std::uint64_t seed = testing::test_seed(21);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  constexpr std::size_t kTotal = 50'000;
  std::vector<float> master(kTotal), exp_avg(kTotal), exp_avg_sq(kTotal);
  TypedBuffer grad(DType::kBf16, kTotal);
  for (std::size_t i = 0; i < kTotal; ++i) {
    master[i] = testing::random_value(rng, -6, 2, false);
    exp_avg[i] = testing::random_value(rng, -12, -4, false);
    exp_avg_sq[i] = std::fabs(testing::random_value(rng, -24, -8, false));
    grad.set(i, testing::random_value(rng, -10, 2, false));
  }
  std::vector<float> master2 = master, exp_avg2 = exp_avg, exp_avg_sq2 = exp_avg_sq;
  TypedBuffer out(DType::kBf16, kTotal), out2(DType::kBf16, kTotal);
  tbb::task_arena arena(2);
  Hyperparams h;
  h.weight_decay = 0.1;
  const double loss_scale = 8.0;

  // Whole buffer.
  GradNormAccumulator whole_norm;
  whole_norm.add(grad.cspan(), arena);
  const double clip = clip_coefficient(whole_norm.norm() / loss_scale, 0.5);
  ASSERT_LT(clip, 1.0) << "the test should exercise clipping";
  ParamSpans whole;
  whole.master = master;
  whole.exp_avg = exp_avg;
  whole.exp_avg_sq = exp_avg_sq;
  whole.grad = grad.cspan();
  whole.param_out = out.span();
  step(h, whole, GradScaling{loss_scale, clip}, arena);

  // Uneven sub-groups, norm fed one by one as each "arrives".
  const std::size_t bounds[] = {0, 7, 16'384, 16'400, 33'333, kTotal};
  const auto* grad_bits = static_cast<const Bf16*>(grad.data());
  GradNormAccumulator split_norm;
  for (std::size_t g = 0; g + 1 < std::size(bounds); ++g) {
    split_norm.add_serial(std::span<const Bf16>(grad_bits + bounds[g], bounds[g + 1] - bounds[g]));
  }
  // Same blocks only when sub-group boundaries fall on blocks: here they do not, so the norms may
  // differ in the last bits; the clip is what the Engine would compute from its own norm.
  EXPECT_NEAR(split_norm.norm(), whole_norm.norm(), 1e-12 * whole_norm.norm());
  auto* out2_bits = static_cast<Bf16*>(out2.data());
  for (std::size_t g = 0; g + 1 < std::size(bounds); ++g) {
    const std::size_t begin = bounds[g];
    const std::size_t count = bounds[g + 1] - begin;
    ParamSpans part;
    part.master = std::span<float>(master2).subspan(begin, count);
    part.exp_avg = std::span<float>(exp_avg2).subspan(begin, count);
    part.exp_avg_sq = std::span<float>(exp_avg_sq2).subspan(begin, count);
    part.grad = std::span<const Bf16>(grad_bits + begin, count);
    part.param_out = std::span<Bf16>(out2_bits + begin, count);
    step(h, part, GradScaling{loss_scale, clip}, arena);
  }
  EXPECT_TRUE(testing::same_bits(master, master2));
  EXPECT_TRUE(testing::same_bits(exp_avg, exp_avg2));
  EXPECT_TRUE(testing::same_bits(exp_avg_sq, exp_avg_sq2));
  EXPECT_TRUE(out.same_bytes(out2));
}

}  // namespace
}  // namespace strata::cpu_adam
