// Proves step() is bitwise identical across threads 1..8, chunkings and SIMD levels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/optimizer.hpp"
#include "tests/cpu_adam/test_support.hpp"

namespace strata::cpu_adam {
namespace {

using testing::TypedBuffer;

constexpr std::size_t kCount = 3 * 4096 + 21;

struct RunResult {
  std::vector<float> master, exp_avg, exp_avg_sq;
  TypedBuffer out{Dtype::kBf16, 0};
};

// Two steps from the same seeded state; returns the state after them.
RunResult run(Algorithm algorithm, Dtype grad_dtype, Dtype out_dtype, int threads,
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
      if (grad_dtype == Dtype::kFp16) g = std::clamp(g, -6e4f, 6e4f);
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
    const ::testing::TestParamInfo<std::tuple<Algorithm, Dtype, Dtype>>& param_info) {
  static const char* kNames[] = {"AdamW", "Adam", "Adagrad", "Lion"};
  return std::string(kNames[static_cast<int>(std::get<0>(param_info.param))]) + "_grad" +
         std::string(dtype_name(std::get<1>(param_info.param))) + "_out" +
         std::string(dtype_name(std::get<2>(param_info.param)));
}

class StepDeterminism : public ::testing::TestWithParam<std::tuple<Algorithm, Dtype, Dtype>> {};

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
                       ::testing::Values(Dtype::kFp32, Dtype::kBf16, Dtype::kFp16),
                       ::testing::Values(Dtype::kBf16, Dtype::kFp16)),
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
    for (Dtype grad_dtype : {Dtype::kFp32, Dtype::kBf16, Dtype::kFp16}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{31}, std::size_t{40'000}}) {
        std::vector<float> master(count), exp_avg(count), exp_avg_sq(count);
        for (std::size_t i = 0; i < count; ++i) {
          master[i] = testing::random_value(rng, -10, 10, true);
          exp_avg[i] = testing::random_value(rng, -10, 10, true);
          exp_avg_sq[i] = testing::random_value(rng, -10, 10, true);
        }
        const std::vector<float> master0 = master, exp_avg0 = exp_avg, exp_avg_sq0 = exp_avg_sq;
        TypedBuffer grad(grad_dtype, count, 1);
        TypedBuffer out(Dtype::kBf16, count, 1);
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
