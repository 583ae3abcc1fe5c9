// Proves cublaslt_gemm.hpp's LtGemm on every combination of transposes, output type, addend and
// bias, on shapes that cross the tensor-core tiles' edges with padded row strides: each output
// element within fp32 accumulation's error bound (and the output's own rounding) of a float64
// host product of the same bf16 operands, outputs poisoned (NaN) first, a second run bitwise
// equal to the first, in place accumulation (C = D) included. Skips, saying why, without CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "models/decoder/cublaslt_gemm.hpp"
#include "tests/models/llm/flash_attention_test_support.hpp"
#include "tiers/device/device.hpp"

namespace strata::llm::cuda {
namespace {

using testing::DeviceArray;

struct Shape {
  std::size_t m, n, k;
};
// Past 64/128/256-wide tiles by a few rows and columns, and one narrow product.
const Shape kShapes[] = {{133, 67, 200}, {65, 257, 129}, {7, 300, 24}};
constexpr std::size_t kPad = 3;  // every row stride is its row's length + 3 elements

float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = round_bf16(uniform(rng));
  return values;
}

std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& values) {
  std::vector<__nv_bfloat16> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __float2bfloat16_rn(values[i]);
  return out;
}

// (transpose A, transpose B, bf16 output, addend C, bias)
using Combination = std::tuple<bool, bool, bool, bool, bool>;

class CublasLtGemmCuda : public ::testing::TestWithParam<Combination> {
 protected:
  void SetUp() override {
    const std::string reason = tiers::cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
};

// One product under test: its shape, its combination, and its operands (bf16-exact floats) in
// padded rows.
struct Case {
  Shape s;
  bool trans_a, trans_b, bf16_out, with_c, with_bias;
  std::size_t lda, ldb, ldd;
  std::vector<float> a, b, c, bias;
};

// The operands of `s` under `combination`, drawn with seeds seed + 1 to seed + 4 (seed advances).
Case make_case(const Shape& s, const Combination& combination, std::uint64_t& seed) {
  const auto [trans_a, trans_b, bf16_out, with_c, with_bias] = combination;
  // Stored shapes: A is [m × k] or, transposed, [k × m]; B is [k × n] or [n × k].
  const std::size_t a_rows = trans_a ? s.k : s.m, a_cols = trans_a ? s.m : s.k;
  const std::size_t b_rows = trans_b ? s.n : s.k, b_cols = trans_b ? s.k : s.n;
  const std::size_t lda = a_cols + kPad, ldb = b_cols + kPad, ldd = s.n + kPad;
  Case t{s, trans_a, trans_b, bf16_out, with_c, with_bias, lda, ldb, ldd, {}, {}, {}, {}};
  t.a = random_values(a_rows * lda, ++seed);
  t.b = random_values(b_rows * ldb, ++seed);
  t.c = random_values(s.m * ldd, ++seed);
  t.bias = random_values(s.n, ++seed);
  return t;
}

// The float64 product and, per element, Σ|a·b| for the accumulation bound.
struct HostProduct {
  std::vector<double> expected, magnitude;
};

HostProduct host_product(const Case& t) {
  const Shape& s = t.s;
  const std::size_t lda = t.lda, ldb = t.ldb, ldd = t.ldd;
  const std::vector<float>& a = t.a;
  const std::vector<float>& b = t.b;
  const std::vector<float>& c = t.c;
  const std::vector<float>& bias = t.bias;
  std::vector<double> expected(s.m * s.n), magnitude(s.m * s.n);
  for (std::size_t i = 0; i < s.m; ++i) {
    for (std::size_t j = 0; j < s.n; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (std::size_t p = 0; p < s.k; ++p) {
        const double x = t.trans_a ? a[p * lda + i] : a[i * lda + p];
        const double y = t.trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        abs_sum += std::abs(x * y);
      }
      if (t.with_c) sum += c[i * ldd + j];
      if (t.with_bias) sum += bias[j];
      expected[i * s.n + j] = sum;
      magnitude[i * s.n + j] = abs_sum + (t.with_c ? std::abs(c[i * ldd + j]) : 0.0) +
                               (t.with_bias ? std::abs(bias[j]) : 0.0);
    }
  }
  return {std::move(expected), std::move(magnitude)};
}

// One run of the product on the device, D poisoned first (or, bf16 with C, starting as C: in
// place); D's rows as floats, padding included.
std::vector<float> run_on_device(LtGemm& gemm, const Case& t, const __nv_bfloat16* a,
                                 const __nv_bfloat16* b) {
  const Shape& s = t.s;
  const std::size_t ldd = t.ldd;
  GemmProduct p;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.a = {a, t.lda, t.trans_a ? Transpose::kYes : Transpose::kNo};
  p.b = {b, t.ldb, t.trans_b ? Transpose::kYes : Transpose::kNo};
  p.ldd = ldd;
  p.d_type = t.bf16_out ? ElementType::kBf16 : ElementType::kFp32;
  std::vector<float> d_host(s.m * ldd);
  if (t.bf16_out) {
    DeviceArray<__nv_bfloat16> d(s.m * ldd), c_dev(to_bf16(t.c)), bias_dev(to_bf16(t.bias));
    if (t.with_c) {  // in place: D starts as C
      testing::check_cuda(cudaMemcpy(d.get(), c_dev.get(), s.m * ldd * 2, cudaMemcpyDeviceToDevice),
                          "cudaMemcpy");
    } else {
      d.poison();
    }
    p.d = d.get();
    p.c = t.with_c ? d.get() : nullptr;
    p.bias = t.with_bias ? bias_dev.get() : nullptr;
    gemm.run(p, nullptr);
    const std::vector<__nv_bfloat16> out = d.download();
    for (std::size_t i = 0; i < out.size(); ++i) d_host[i] = __bfloat162float(out[i]);
  } else {
    DeviceArray<float> d(s.m * ldd), c_dev(t.c), bias_dev(t.bias);
    d.poison();
    p.d = d.get();
    p.c = t.with_c ? c_dev.get() : nullptr;  // out of place: C and D apart
    p.bias = t.with_bias ? bias_dev.get() : nullptr;
    gemm.run(p, nullptr);
    d_host = d.download();
  }
  return d_host;
}

// Every element of D within its bound of the float64 product; the first three misses named.
void expect_within_bound(const Case& t, const HostProduct& host, const std::vector<float>& d) {
  const Shape& s = t.s;
  // fp32 accumulation of k products (and the addends): |error| ≤ (k + 2)·2⁻²⁴·Σ|terms|
  // (Higham's γ_n, fused multiply-adds). A bf16 output then rounds to 8 significant bits: at
  // most half an ulp, 2⁻⁸ of the value (the first H200 run bounded it by 2⁻⁹ and failed
  // correctly rounded values, e.g. -5.4864 stored as -5.5). Where cuBLASLt has no bias epilogue
  // for the shape, the product p is rounded before the bias is added apart and the sum rounds
  // again: 2⁻⁸·(|p| + |e|) with |p| ≤ |e| + |bias|. A wrong operand, stride or transpose is off
  // by O(Σ|terms|).
  const double gamma = static_cast<double>(s.k + 2) * std::ldexp(1.0, -24);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < s.m; ++i) {
    for (std::size_t j = 0; j < s.n; ++j) {
      const double e = host.expected[i * s.n + j];
      const double accumulation = gamma * host.magnitude[i * s.n + j];
      const double rounding =
          t.bf16_out ? std::ldexp(1.0, -8) *
                           (std::abs(e) + accumulation +
                            (t.with_bias ? std::abs(e) + std::abs(t.bias[j]) + accumulation : 0.0))
                     : 0.0;
      const double bound = accumulation + rounding;
      const double actual = d[i * t.ldd + j];
      if (!(std::abs(actual - e) <= bound) && ++bad <= 3) {
        ADD_FAILURE() << "D[" << i << "][" << j << "] = " << actual << ", expected " << e
                      << " (bound " << bound << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST_P(CublasLtGemmCuda, MatchesAHostProductOfTheSameOperands) {
  DeviceArray<std::byte> workspace(LtGemm::kWorkspaceBytes);
  LtGemm gemm(workspace.get(), LtGemm::kWorkspaceBytes, 0, "test");
  std::uint64_t seed = 7;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("m " + std::to_string(s.m) + " n " + std::to_string(s.n) + " k " +
                 std::to_string(s.k));
    const Case t = make_case(s, GetParam(), seed);
    DeviceArray<__nv_bfloat16> a_dev(to_bf16(t.a)), b_dev(to_bf16(t.b));
    const HostProduct host = host_product(t);

    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      runs.push_back(run_on_device(gemm, t, a_dev.get(), b_dev.get()));
    }
    expect_within_bound(t, host, runs[0]);
    for (std::size_t i = 0; i < s.m; ++i) {  // the rows only: the padding is not D's
      EXPECT_EQ(std::memcmp(runs[0].data() + i * t.ldd, runs[1].data() + i * t.ldd, s.n * 4), 0)
          << "row " << i << " differs between two runs";
    }
  }
  EXPECT_GT(gemm.cached_shapes(), 0u);
}

std::string combination_name(const ::testing::TestParamInfo<Combination>& param_info) {
  const auto [ta, tb, bf16, c, bias] = param_info.param;
  return std::string(ta ? "At" : "A") + (tb ? "Bt" : "B") + (bf16 ? "_bf16" : "_fp32") +
         (c ? "_plusC" : "") + (bias ? "_bias" : "");
}

INSTANTIATE_TEST_SUITE_P(Combinations, CublasLtGemmCuda,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Bool()),
                         combination_name);

}  // namespace
}  // namespace strata::llm::cuda
