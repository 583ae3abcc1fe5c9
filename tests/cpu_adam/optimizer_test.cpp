// Proves every rule, level and dtype mix matches a double reference; 16-bit copy-out bit-exact.
#include "cpu_adam/optimizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/cpu_adam/test_support.hpp"

namespace strata::cpu_adam {
namespace {

using testing::TypedBuffer;

// Tolerance. Each reference quantity is reached in fp32 by at most ~10 correctly rounded
// operations, each adding at most u = 2^-24 of the magnitude of its operands, plus one rounding of
// each fp32 constant (betas, step size, multiplier). The error of a result is therefore bounded by
// a small multiple of u times the sum of the magnitudes of the terms that formed it ("mag" below);
// kUlps = 32 covers that with margin. A wrong formula (missing bias correction, wrong beta) is off
// by 1e-3 or more, far beyond it. kDenormalSlack allows for results that land in fp32's denormal
// range or underflow (g*g of 1e-30), where the relative bound does not hold.
constexpr double kUnit = 0x1p-24;
constexpr double kUlps = 32;
constexpr double kDenormalSlack = 16 * 0x1p-149;

// `gain` is how much an absolute error in the gradient is amplified into the result (lr / denom
// for the parameter): a gradient in the denormal range carries an absolute error of up to
// kDenormalSlack, which the division by a small denominator magnifies.
double tolerance(double magnitude, double gain = 0.0) {
  return kUlps * kUnit * magnitude + kDenormalSlack * (1.0 + gain);
}

struct Config {
  SimdLevel level;
  Algorithm algorithm;
  DType grad_dtype;
  std::optional<DType> out_dtype;
};

std::string config_name(
    const ::testing::TestParamInfo<std::tuple<SimdLevel, Algorithm, DType, int>>& info) {
  const auto [level, algorithm, grad, out] = info.param;
  static const char* kAlgorithms[] = {"AdamW", "Adam", "Adagrad", "Lion"};
  static const char* kOuts[] = {"NoOut", "OutBf16", "OutFp16"};
  return std::string(simd_level_name(level)) + "_" + kAlgorithms[static_cast<int>(algorithm)] +
         "_" + std::string(dtype_name(grad)) + "_" + kOuts[out];
}

// One sub-group's buffers, with a copy of the state before the step for the reference.
struct Problem {
  Problem(const Config& config, std::size_t count, std::size_t offset)
      : master(DType::kFp32, count, offset),
        exp_avg(DType::kFp32, count, offset),
        exp_avg_sq(DType::kFp32, count, offset),
        grad(config.grad_dtype, count, offset),
        out(config.out_dtype.value_or(DType::kBf16), count, offset),
        has_out(config.out_dtype.has_value()) {}

  ParamSpans spans(Algorithm algorithm) {
    ParamSpans s;
    const std::size_t n = master.count();
    s.master = {static_cast<float*>(master.data()), n};
    if (algorithm != Algorithm::kAdagrad) s.exp_avg = {static_cast<float*>(exp_avg.data()), n};
    if (algorithm != Algorithm::kLion) s.exp_avg_sq = {static_cast<float*>(exp_avg_sq.data()), n};
    s.grad = grad.cspan();
    if (has_out) s.param_out = out.span();
    return s;
  }

  TypedBuffer master, exp_avg, exp_avg_sq, grad, out;
  bool has_out;
};

void fill_state(Problem& p, std::mt19937_64& rng, bool edges) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (std::size_t i = 0; i < p.master.count(); ++i) {
    p.master.set(i, testing::random_value(rng, -8, 3, edges));
    p.exp_avg.set(i, 1e-2f * unit(rng));
    p.exp_avg_sq.set(i, std::fabs(1e-4f * unit(rng)));
  }
}

// A fresh gradient every step; the state evolves.
void fill_grad(Problem& p, DType grad_dtype, std::mt19937_64& rng, bool edges) {
  for (std::size_t i = 0; i < p.master.count(); ++i) {
    float g = testing::random_value(rng, -20, 4, edges);
    if (grad_dtype == DType::kFp16) g = std::clamp(g, -6e4f, 6e4f);  // fp16 has no 1e18
    p.grad.set(i, g);
  }
}

// Names a failing element; only formatted when an assertion fails (gtest streams lazily).
struct Where {
  const std::string& label;
  int step;
  std::size_t i;
  float p0, m0, v0, g;
};

std::ostream& operator<<(std::ostream& out, const Where& w) {
  return out << w.label << " step " << w.step << " i=" << w.i << std::setprecision(9)
             << " (p0=" << w.p0 << " m0=" << w.m0 << " v0=" << w.v0 << " g=" << w.g << ")";
}

// Checks one element's step against the double reference computed from the state before it.
void check_element(const Config& config, const Hyperparams& h, const GradScaling& s, float p0,
                   float m0, float v0, float g_raw, float p1, float m1, float v1,
                   const Where& where) {
  const double multiplier = s.clip_coef / s.loss_scale;
  double g = static_cast<double>(g_raw) * multiplier;
  double mag_g = std::fabs(g);
  const double p = p0;
  if ((config.algorithm == Algorithm::kAdam || config.algorithm == Algorithm::kAdagrad) &&
      h.weight_decay != 0) {
    g += h.weight_decay * p;
    mag_g += std::fabs(h.weight_decay * p);
  }
  const bool decoupled =
      config.algorithm == Algorithm::kAdamW || config.algorithm == Algorithm::kLion;
  const double decay = decoupled ? 1.0 - h.lr * h.weight_decay : 1.0;
  switch (config.algorithm) {
    case Algorithm::kAdamW:
    case Algorithm::kAdam: {
      const double m = h.beta1 * m0 + (1 - h.beta1) * g;
      const double mag_m = std::fabs(h.beta1 * m0) + (1 - h.beta1) * mag_g;
      const double v = h.beta2 * v0 + (1 - h.beta2) * g * g;
      const double mag_v = h.beta2 * v0 + (1 - h.beta2) * mag_g * mag_g;
      const bool bc = h.bias_correction == BiasCorrection::kOn;
      const double t = static_cast<double>(h.step);
      const double bc1 = bc ? 1 - std::pow(h.beta1, t) : 1.0;
      const double bc2 = bc ? 1 - std::pow(h.beta2, t) : 1.0;
      const double denom = std::sqrt(v) / std::sqrt(bc2) + h.eps;
      const double update = (h.lr / bc1) * m / denom;
      const double expected = p * decay - update;
      const double mag_update = (h.lr / bc1) * mag_m / denom * (1 + (v > 0 ? mag_v / v : 1.0));
      EXPECT_NEAR(m1, m, tolerance(mag_m)) << "exp_avg " << where;
      EXPECT_NEAR(v1, v, tolerance(mag_v)) << "exp_avg_sq " << where;
      EXPECT_NEAR(p1, expected, tolerance(std::fabs(p) + mag_update, (h.lr / bc1) / denom))
          << "master " << where;
      break;
    }
    case Algorithm::kAdagrad: {
      const double sum = v0 + g * g;
      const double mag_sum = v0 + mag_g * mag_g;
      const double denom = std::sqrt(sum) + h.eps;
      const double expected = p - h.lr * g / denom;
      const double mag_update = h.lr * mag_g / denom * (1 + (sum > 0 ? mag_sum / sum : 1.0));
      EXPECT_NEAR(v1, sum, tolerance(mag_sum)) << "sum " << where;
      EXPECT_NEAR(p1, expected, tolerance(std::fabs(p) + mag_update, h.lr / denom))
          << "master " << where;
      break;
    }
    case Algorithm::kLion: {
      const double c = h.beta1 * m0 + (1 - h.beta1) * g;
      const double mag_c = std::fabs(h.beta1 * m0) + (1 - h.beta1) * mag_g;
      const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
      // Where c is within rounding of zero the fp32 sign may legitimately differ: allow one lr.
      const double ambiguous = std::fabs(c) <= tolerance(mag_c) ? h.lr : 0.0;
      const double expected = p * decay - h.lr * sign;
      EXPECT_NEAR(p1, expected, tolerance(std::fabs(p) + h.lr) + ambiguous) << "master " << where;
      const double m = h.beta2 * m0 + (1 - h.beta2) * g;
      EXPECT_NEAR(m1, m, tolerance(std::fabs(h.beta2 * m0) + (1 - h.beta2) * mag_g))
          << "exp_avg " << where;
      break;
    }
  }
}

Hyperparams hyperparams_for_step(Algorithm algorithm, int step) {
  Hyperparams h;
  h.algorithm = algorithm;
  h.step = step;
  // A schedule: every value changes from step to step.
  h.lr = 1e-3 * (1.0 + 0.5 * step);
  h.beta1 = algorithm == Algorithm::kLion ? 0.9 : 0.9 - 0.01 * step;
  h.beta2 = algorithm == Algorithm::kLion ? 0.99 : 0.999 - 0.001 * step;
  h.eps = 1e-8 * step;
  h.weight_decay = 0.01 * (step % 3);
  h.bias_correction = step % 4 == 3 ? BiasCorrection::kOff : BiasCorrection::kOn;
  return h;
}

GradScaling scaling_for_step(int step) {
  GradScaling s;
  s.loss_scale = step % 2 == 0 ? 1.0 : 1024.0;
  s.clip_coef = step == 2 ? 0.25 : 1.0;
  return s;
}

void run_steps(const Config& config, Problem& problem, int steps, tbb::task_arena& arena,
               std::mt19937_64& rng, bool edges, const std::string& label) {
  const std::size_t n = problem.master.count();
  std::vector<float> p0(n), m0(n), v0(n), g0(n);
  ExecOptions options;
  options.simd_level = config.level;
  for (int step = 1; step <= steps; ++step) {
    if (step == 1) fill_state(problem, rng, edges);
    fill_grad(problem, config.grad_dtype, rng, edges);
    for (std::size_t i = 0; i < n; ++i) {
      p0[i] = problem.master.get(i);
      m0[i] = problem.exp_avg.get(i);
      v0[i] = problem.exp_avg_sq.get(i);
      g0[i] = problem.grad.get(i);
    }
    const Hyperparams h = hyperparams_for_step(config.algorithm, step);
    const GradScaling s = scaling_for_step(step);
    cpu_adam::step(h, problem.spans(config.algorithm), s, arena, options);
    ASSERT_TRUE(problem.master.guards_intact() && problem.exp_avg.guards_intact() &&
                problem.exp_avg_sq.guards_intact() && problem.grad.guards_intact() &&
                problem.out.guards_intact())
        << "a kernel wrote outside its span: " << label << " step " << step;
    for (std::size_t i = 0; i < n; ++i) {
      const Where where{label, step, i, p0[i], m0[i], v0[i], g0[i]};
      const float p1 = problem.master.get(i);
      const float m1 = config.algorithm == Algorithm::kAdagrad ? m0[i] : problem.exp_avg.get(i);
      const float v1 = config.algorithm == Algorithm::kLion ? v0[i] : problem.exp_avg_sq.get(i);
      check_element(config, h, s, p0[i], m0[i], v0[i], g0[i], p1, m1, v1, where);
      if (config.algorithm == Algorithm::kAdagrad) {
        EXPECT_EQ(problem.exp_avg.get(i), m0[i]) << where;
      }
      if (config.out_dtype == DType::kBf16) {
        ASSERT_EQ(problem.out.bits(i), testing::reference_bf16_bits(p1)) << "bf16 out " << where;
      } else if (config.out_dtype == DType::kFp16) {
        ASSERT_EQ(problem.out.bits(i), to_fp16(p1).bits) << "fp16 out " << where;
      }
      if (::testing::Test::HasFailure()) return;
    }
  }
}

class OptimizerReference
    : public ::testing::TestWithParam<std::tuple<SimdLevel, Algorithm, DType, int>> {
 protected:
  Config config() const {
    const auto [level, algorithm, grad, out] = GetParam();
    std::optional<DType> out_dtype;
    if (out == 1) out_dtype = DType::kBf16;
    if (out == 2) out_dtype = DType::kFp16;
    return Config{level, algorithm, grad, out_dtype};
  }
  void SetUp() override {
    if (!simd_level_available(std::get<0>(GetParam()))) {
      GTEST_SKIP() << "SIMD level " << simd_level_name(std::get<0>(GetParam()))
                   << " not supported by this CPU";
    }
  }
};

// Lengths 0..3 vector widths + 1 at every start offset 0..3 elements, edge values included.
TEST_P(OptimizerReference, ShortUnalignedSpansWithEdgeValues) {
  const Config c = config();
  const std::uint64_t seed = testing::test_seed(1234);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  tbb::task_arena arena(1);
  const std::size_t max_len = 3 * static_cast<std::size_t>(simd_width(SimdLevel::kAvx512)) + 1;
  for (std::size_t offset = 0; offset < 4; ++offset) {
    for (std::size_t len = 0; len <= max_len; ++len) {
      Problem problem(c, len, offset);
      run_steps(c, problem, 4, arena, rng, true,
                "len=" + std::to_string(len) + " offset=" + std::to_string(offset));
      if (HasFailure()) return;
    }
  }
}

// A longer span split over threads and chunks, four steps of a schedule.
TEST_P(OptimizerReference, LongSpanSeveralSteps) {
  const Config c = config();
  const std::uint64_t seed = testing::test_seed(99);
  SCOPED_TRACE(testing::seed_note(seed));
  std::mt19937_64 rng(seed);
  tbb::task_arena arena(2);
  Problem problem(c, 40'000 + 3, 1);
  run_steps(c, problem, 4, arena, rng, false, "long");
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, OptimizerReference,
    ::testing::Combine(::testing::Values(SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2,
                                         SimdLevel::kAvx512),
                       ::testing::Values(Algorithm::kAdamW, Algorithm::kAdam, Algorithm::kAdagrad,
                                         Algorithm::kLion),
                       ::testing::Values(DType::kFp32, DType::kBf16, DType::kFp16),
                       ::testing::Values(0, 1, 2)),
    config_name);

TEST(OptimizerValidation, RejectsBadHyperparameters) {
  const GradScaling ok_scaling;
  Hyperparams h;
  EXPECT_NO_THROW(validate(h, ok_scaling));
  h.lr = -1;
  EXPECT_THROW(validate(h, ok_scaling), std::invalid_argument);
  h = Hyperparams{};
  h.beta1 = 1.0;
  EXPECT_THROW(validate(h, ok_scaling), std::invalid_argument);
  h = Hyperparams{};
  h.step = 0;
  EXPECT_THROW(validate(h, ok_scaling), std::invalid_argument);
  h = Hyperparams{};
  h.eps = std::nan("");
  EXPECT_THROW(validate(h, ok_scaling), std::invalid_argument);
  GradScaling bad;
  bad.loss_scale = 0;
  EXPECT_THROW(validate(Hyperparams{}, bad), std::invalid_argument);
}

TEST(OptimizerBytes, CountsEachArrayOnce) {
  EXPECT_EQ(bytes_per_element(Algorithm::kAdamW, DType::kFp32, std::nullopt), 28u);
  EXPECT_EQ(bytes_per_element(Algorithm::kAdamW, DType::kBf16, DType::kBf16), 28u);
  EXPECT_EQ(bytes_per_element(Algorithm::kAdam, DType::kFp16, std::nullopt), 26u);
  EXPECT_EQ(bytes_per_element(Algorithm::kLion, DType::kFp32, std::nullopt), 20u);
}

}  // namespace
}  // namespace strata::cpu_adam
