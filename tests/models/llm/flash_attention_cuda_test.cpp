// Proves the tensor-core flash attention (flash_attention.hpp) on shapes that cross its 64-row
// tiles: forward (out, lse) and backward (dq, dk, dv) within bf16 rounding of the fp32 reference
// kernel through both interfaces, masks exact (causal, window, packed documents, sequence ends)
// in the forward and the backward, bitwise-equal reruns, and refused shapes. Skips, saying why,
// where CUDA cannot be used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/models/llm/flash_attention_test_support.hpp"
#include "tiers/device/device.hpp"

namespace strata::llm::cuda {
namespace {

using testing::Batch;
using testing::compare;
using testing::Errors;
using testing::Kernel;
using testing::Results;
using testing::Shape;
using testing::TensorView;

constexpr std::uint64_t kSeed = 20261204;

// bf16 keeps 8 significant bits (a relative rounding error of at most 2⁻⁸) of q, k, v, dout and
// of P and dS before their products. Those roundings emulated on the host (fp32 sums otherwise)
// on these tests' own shapes and N(0, 1) inputs gave relative Frobenius errors up to 4.7e-3 for
// every tensor, largest element errors up to 6.3e-3 of the tensor's largest |value|, (row, head)
// errors up to 1.8e-2 of the row's norm for out, dk and dv (rows floored at half the mean row
// norm), lse within 1.35e-2 (it moves with the rounding of the largest scores, up to
// 2⁻⁷·scale·Σ_c |q_c·k_c|). The bounds leave 2x or more. dq has no row bound: a query that sees
// few keys has dS = P·(dP - delta) nearly cancelling, so its row is rounding noise of a fixed size
// (0 in exact arithmetic for a single key) while typical rows shrink as 1/sqrt(keys seen); the
// emulation's worst dq row reached 0.16 of the floor at 1000 positions. A layout bug is O(1); a
// key too many or too few moves its row by about 1/sqrt(keys seen), which the exact-mask tests
// below catch at any length.
constexpr double kRelativeFrobenius = 1e-2;
constexpr double kMaxOverScale = 2e-2;
constexpr double kWorstRow = 5e-2;
constexpr double kLseAbs = 3e-2;

std::string shape_name(const Shape& s) {
  std::string name;  // appended piece by piece: GCC 12 -Wrestrict misfires on "s" + string
  for (const auto& [tag, value] :
       {std::pair{"s", s.sequences}, std::pair{"_p", s.positions}, std::pair{"_h", s.heads},
        std::pair{"kv", s.kv_heads}, std::pair{"_d", s.head_dim}, std::pair{"_w", s.window},
        std::pair{"_doc", s.document}}) {
    name += tag;
    name += std::to_string(value);
  }
  return name;
}

}  // namespace
}  // namespace strata::llm::cuda

namespace strata::llm::cuda::testing {
void PrintTo(const Shape& shape, std::ostream* os);  // gtest prints parameters through it
void PrintTo(const Shape& shape, std::ostream* os) {
  *os << shape_name(shape);
}
}  // namespace strata::llm::cuda::testing

namespace strata::llm::cuda {
namespace {

class FlashAttentionCuda : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const std::string reason = tiers::cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
    if (!flash_attention_supported(GetParam().head_dim, 0)) {
      GTEST_SKIP() << "this GPU cannot run the tensor-core attention (sm_80+, shared memory)";
    }
  }
  std::uint64_t seed() const {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return kSeed + std::hash<std::string>{}(info->name()) % 1000;
  }
};

enum class RowBound { kChecked, kNone };

void expect_within_bf16(const Errors& e, const char* name, RowBound rows = RowBound::kChecked) {
  EXPECT_TRUE(e.finite) << name << ": NaN or infinity (an element left unwritten?)";
  EXPECT_LE(e.relative_frobenius, kRelativeFrobenius) << name;
  EXPECT_LE(e.max_over_scale, kMaxOverScale) << name;
  if (rows == RowBound::kChecked) {
    EXPECT_LE(e.worst_row, kWorstRow) << name;
  }
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

void expect_forward_near(const Batch& batch, const Results& actual, const Results& expected) {
  const Shape& s = batch.shape;
  expect_within_bf16(compare(actual.out, expected.out, {"out", batch.q_width(), 0, s.heads},
                             batch.rows(), s.head_dim),
                     "out");
  EXPECT_LE(max_abs_difference(actual.lse, expected.lse), kLseAbs) << "lse";
}

// With one position every query sees only itself: P = 1 and dS = dP - delta is 0 in exact
// arithmetic, so dq and dk are rounding noise on both sides and relative errors mean nothing.
// Then dP = bf16(dout)·bf16(v) and delta = dout·out with out = bf16(v), so |dS| is at most
// 2⁻⁸·Σ_c |dout_c·v_c| (bf16 rounds by at most 2⁻⁸ relative) and |dq_c| = scale·|bf16(dS)·k_c|
// (|dk_c| = scale·Σ_heads |bf16(dS)·q_c|) at most that times |k_c| (|q_c|), with 2% for the
// roundings of v, k, q and dS themselves: held element by element.
void expect_single_key_gradients_bounded(const Batch& batch, const Results& actual) {
  const Shape& s = batch.shape;
  const std::size_t d = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::size_t group = s.heads / s.kv_heads;
  std::size_t bad = 0;
  for (std::size_t r = 0; r < batch.rows(); ++r) {
    const float* qkv = batch.qkv.data() + r * batch.qkv_width();
    const float* dqkv = actual.dqkv.data() + r * batch.qkv_width();
    std::vector<double> dk_bound(s.kv_heads * d, 0.0);
    for (std::size_t h = 0; h < s.heads; ++h) {
      const std::size_t g = h / group;
      const float* v = qkv + batch.v_offset() + g * d;
      const float* dout = batch.dout.data() + r * batch.q_width() + h * d;
      double ds = 0;
      for (std::size_t c = 0; c < d; ++c) ds += std::abs(static_cast<double>(dout[c]) * v[c]);
      ds *= std::ldexp(1.0, -8) * 1.02;
      for (std::size_t c = 0; c < d; ++c) {
        const double bound = scale * ds * std::abs(qkv[batch.k_offset() + g * d + c]) + 1e-6;
        if (!(std::abs(dqkv[h * d + c]) <= bound) && ++bad <= 5) {
          ADD_FAILURE() << "dq[row " << r << ", head " << h << ", " << c
                        << "] = " << dqkv[h * d + c] << " beyond rounding noise " << bound;
        }
        dk_bound[g * d + c] += scale * ds * std::abs(qkv[h * d + c]);
      }
    }
    for (std::size_t c = 0; c < s.kv_heads * d; ++c) {
      const double value = dqkv[batch.k_offset() + c];
      if (!(std::abs(value) <= dk_bound[c] + 1e-6) && ++bad <= 5) {
        ADD_FAILURE() << "dk[row " << r << ", " << c << "] = " << value << " beyond rounding noise "
                      << dk_bound[c];
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

void expect_backward_near(const Batch& batch, const Results& actual, const Results& expected) {
  const Shape& s = batch.shape;
  const std::size_t ld = batch.qkv_width();
  for (const TensorView view :
       {TensorView{"dq", ld, 0, s.heads}, TensorView{"dk", ld, batch.k_offset(), s.kv_heads},
        TensorView{"dv", ld, batch.v_offset(), s.kv_heads}}) {
    if (s.positions == 1 && view.first != batch.v_offset()) continue;
    expect_within_bf16(compare(actual.dqkv, expected.dqkv, view, batch.rows(), s.head_dim),
                       view.name, view.first == 0 ? RowBound::kNone : RowBound::kChecked);
  }
  if (s.positions == 1) expect_single_key_gradients_bounded(batch, actual);
}

TEST_P(FlashAttentionCuda, ForwardMatchesTheFp32Kernel) {
  SCOPED_TRACE("seed " + std::to_string(seed()));
  const Batch batch = testing::random_batch(GetParam(), seed());
  expect_forward_near(batch, testing::run(batch, Kernel::kFlash),
                      testing::run(batch, Kernel::kFp32));
}

TEST_P(FlashAttentionCuda, BackwardMatchesTheFp32Kernel) {
  SCOPED_TRACE("seed " + std::to_string(seed()));
  const Batch batch = testing::random_batch(GetParam(), seed());
  expect_backward_near(batch, testing::run(batch, Kernel::kFlash),
                       testing::run(batch, Kernel::kFp32));
}

// The bf16 interface on strided (fused q | k | v) inputs rounded on the host: its forward is the
// fp32 interface's bit for bit (the same bf16 values reach the same kernel); its backward takes
// delta from bf16 dout and out instead of fp32, so it is held to the reference's bounds.
TEST_P(FlashAttentionCuda, Bf16InterfaceMatchesTheFp32Interface) {
  SCOPED_TRACE("seed " + std::to_string(seed()));
  const Batch batch = testing::random_batch(GetParam(), seed());
  const Results bf16 = testing::run(batch, Kernel::kFlashBf16);
  const Results fp32 = testing::run(batch, Kernel::kFlash);
  ASSERT_EQ(bf16.out.size(), fp32.out.size());
  EXPECT_EQ(std::memcmp(bf16.out.data(), fp32.out.data(), fp32.out.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(bf16.lse.data(), fp32.lse.data(), fp32.lse.size() * sizeof(float)), 0);
  expect_backward_near(batch, bf16, testing::run(batch, Kernel::kFp32));
}

TEST_P(FlashAttentionCuda, RunsAreBitwiseEqual) {
  SCOPED_TRACE("seed " + std::to_string(seed()));
  const Batch batch = testing::random_batch(GetParam(), seed());
  const Results first = testing::run(batch, Kernel::kFlash);
  const Results again = testing::run(batch, Kernel::kFlash);
  for (const auto& [name, a, b] :
       {std::tuple{"out", &first.out, &again.out}, std::tuple{"lse", &first.lse, &again.lse},
        std::tuple{"dq | dk | dv", &first.dqkv, &again.dqkv}}) {
    ASSERT_EQ(a->size(), b->size());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << name;
  }
}

// q = 0 makes every visible score 0: each query's output is the plain mean of the v rows it sees
// and its lse is log(keys seen). v holds multiples of 1/32 below 4, exact in bf16 and in fp32
// sums, so the kernel's only error is the final division: any key wrongly in or out of a row's
// mask, at any row length, shows far above it.
TEST_P(FlashAttentionCuda, UniformAttentionAveragesExactlyTheVisibleKeys) {
  SCOPED_TRACE("seed " + std::to_string(seed()));
  Batch batch = testing::random_batch(GetParam(), seed());
  const Shape& s = batch.shape;
  for (std::size_t r = 0; r < batch.rows(); ++r) {
    float* row = batch.qkv.data() + r * batch.qkv_width();
    for (std::size_t c = 0; c < batch.q_width(); ++c) row[c] = 0.0f;
    for (std::size_t c = batch.v_offset(); c < batch.qkv_width(); ++c) {
      row[c] = std::round(row[c] * 32.0f) / 32.0f;
      row[c] = std::max(-4.0f, std::min(4.0f, row[c]));
    }
  }
  const Results results = testing::run(batch, Kernel::kFlash);
  // A query sees the keys [max(its first key, query + 1 - window), query]: sums of v over them
  // from prefix sums (exact in double, as in fp32).
  std::size_t bad = 0;
  std::vector<double> prefix((s.positions + 1) * s.head_dim);
  for (std::size_t b = 0; b < s.sequences; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      const std::size_t g = h / (s.heads / s.kv_heads);
      for (std::size_t j = 0; j < s.positions; ++j) {
        const float* v = batch.qkv.data() + (b * s.positions + j) * batch.qkv_width() +
                         batch.v_offset() + g * s.head_dim;
        for (std::size_t c = 0; c < s.head_dim; ++c) {
          prefix[(j + 1) * s.head_dim + c] = prefix[j * s.head_dim + c] + v[c];
        }
      }
      for (std::size_t i = 0; i < s.positions; ++i) {
        std::size_t first = batch.first_key[b * s.positions + i];
        if (s.window != 0 && i + 1 > s.window) first = std::max(first, i + 1 - s.window);
        const std::size_t seen = i + 1 - first;
        const std::size_t row = b * s.positions + i;
        for (std::size_t c = 0; c < s.head_dim; ++c) {
          const double expected =
              (prefix[(i + 1) * s.head_dim + c] - prefix[first * s.head_dim + c]) /
              static_cast<double>(seen);
          const double actual = results.out[row * batch.q_width() + h * s.head_dim + c];
          if (!(std::abs(actual - expected) <= 1e-6 * (1.0 + std::abs(expected))) && ++bad <= 5) {
            ADD_FAILURE() << "out[sequence " << b << ", head " << h << ", query " << i
                          << ", column " << c << "] = " << actual << ", the mean of its " << seen
                          << " keys is " << expected;
          }
        }
        const double lse = results.lse[(b * s.heads + h) * s.positions + i];
        if (!(std::abs(lse - std::log(static_cast<double>(seen))) <= 1e-5) && ++bad <= 5) {
          ADD_FAILURE() << "lse[sequence " << b << ", head " << h << ", query " << i
                        << "] = " << lse << ", log(" << seen << " keys) expected";
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

// Exact zero patterns of the backward, probing the key and query ranges dq_kernel and
// dkdv_kernel walk (windows, documents, tile edges, the group's heads) at any length. One kv head
// with the shape's group. The first half of the sequences each keep dout of one query q* of the
// group's last head (k = 0: uniform P): dv_j = P(q*, j)·dout(q*) is non-zero exactly for the keys
// q* sees, and dk_j is 0 for the others. The second half each keep k of one key j* (q = 0):
// dq_i = scale·dS(i, j*)·k(j*) is 0 for the queries that do not see j*, and non-zero for those
// that do and see another key too (a query's only key gets dS = 0 in exact arithmetic).
TEST_P(FlashAttentionCuda, BackwardReachesExactlyTheVisiblePairs) {
  const Shape& param = GetParam();
  std::set<std::size_t> probe_set;
  for (const std::size_t p :
       {std::size_t{0}, std::size_t{31}, std::size_t{32}, std::size_t{63}, std::size_t{64},
        std::size_t{65}, param.positions / 2, param.positions - 1}) {
    if (p < param.positions) probe_set.insert(p);
  }
  const std::vector<std::size_t> probes(probe_set.begin(), probe_set.end());
  const std::size_t n = probes.size();
  const std::size_t group = param.heads / param.kv_heads;
  const Shape shape{2 * n, param.positions, group, 1, param.head_dim, param.window, param.document};
  SCOPED_TRACE("seed " + std::to_string(seed()));
  Batch batch = testing::random_batch(shape, seed());
  const std::size_t d = shape.head_dim;
  const std::size_t probe_head = group - 1;
  const auto qkv_row = [&](std::size_t b, std::size_t i) {
    return batch.qkv.data() + (b * shape.positions + i) * batch.qkv_width();
  };
  for (std::size_t b = 0; b < 2 * n; ++b) {
    for (std::size_t i = 0; i < shape.positions; ++i) {
      if (b < n) {
        std::fill_n(qkv_row(b, i) + batch.k_offset(), d, 0.0f);
        float* g = batch.dout.data() + (b * shape.positions + i) * batch.q_width();
        for (std::size_t h = 0; h < group; ++h) {
          if (i != probes[b] || h != probe_head) std::fill_n(g + h * d, d, 0.0f);
        }
      } else {
        std::fill_n(qkv_row(b, i), batch.q_width(), 0.0f);
        if (i != probes[b - n]) std::fill_n(qkv_row(b, i) + batch.k_offset(), d, 0.0f);
      }
    }
  }
  const Results results = testing::run(batch, Kernel::kFlash);
  const auto count_nonzero = [&](std::size_t b, std::size_t i, std::size_t column) {
    const float* row = results.dqkv.data() + (b * shape.positions + i) * batch.qkv_width();
    return static_cast<std::size_t>(
        std::count_if(row + column, row + column + d, [](float x) { return x != 0.0f; }));
  };
  std::size_t bad = 0;
  const auto expect = [&bad](bool ok, const std::string& what) {
    if (!ok && ++bad <= 5) ADD_FAILURE() << what;
  };
  for (std::size_t b = 0; b < n; ++b) {
    const std::size_t query = probes[b];
    for (std::size_t j = 0; j < shape.positions; ++j) {
      const bool sees = batch.sees(b, query, j);
      const std::string where = "query " + std::to_string(query) + ", key " + std::to_string(j) +
                                (sees ? " (visible)" : " (masked)") + ": ";
      expect(count_nonzero(b, j, batch.v_offset()) == (sees ? d : 0), where + "dv");
      if (!sees) expect(count_nonzero(b, j, batch.k_offset()) == 0, where + "dk");
    }
  }
  for (std::size_t b = n; b < 2 * n; ++b) {
    const std::size_t key = probes[b - n];
    for (std::size_t i = 0; i < shape.positions; ++i) {
      std::size_t seen = 0;
      for (std::size_t j = 0; j <= i; ++j) seen += batch.sees(b, i, j) ? 1 : 0;
      const bool sees = batch.sees(b, i, key);
      for (std::size_t h = 0; h < group; ++h) {
        const std::size_t nonzero = count_nonzero(b, i, h * d);
        const std::string where = "key " + std::to_string(key) + ", query " + std::to_string(i) +
                                  ", head " + std::to_string(h) + ": dq";
        if (!sees) expect(nonzero == 0, where + " non-zero for a masked pair");
        if (sees && seen > 1) expect(nonzero == d, where + " zero for a visible pair");
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

const Shape kShapes[] = {
    {2, 1, 4, 4, 64, 0, 0},      {3, 17, 8, 2, 128, 5, 0},      {2, 63, 16, 4, 64, 100, 0},
    {2, 64, 4, 4, 128, 0, 20},   {2, 65, 8, 2, 64, 0, 0},       {2, 65, 16, 4, 128, 5, 30},
    {2, 200, 4, 4, 64, 5, 0},    {2, 200, 8, 2, 128, 100, 45},  {1, 200, 16, 4, 128, 0, 0},
    {2, 1000, 16, 4, 128, 0, 0}, {1, 1000, 8, 2, 64, 100, 150}, {1, 1000, 4, 4, 128, 5, 0},
    {2, 130, 4, 2, 96, 0, 0},    {2, 100, 2, 1, 32, 0, 25},     {3, 70, 4, 2, 8, 5, 13},
};

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionCuda, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape>& param_info) {
                           return shape_name(param_info.param);
                         });

// The bf16-output forward (what the bf16 decoder stores) rounds the fp32 output as it stores it:
// every element bit for bit bf16(fp32 overload's element), the log-sum-exp bit for bit equal,
// outputs poisoned first; both head_dim paddings, GQA, a window, packed documents.
TEST(FlashAttentionCudaBf16Output, IsTheFloatOutputRounded) {
  const std::string reason = tiers::cuda_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
  if (!flash_attention_supported(64, 0)) GTEST_SKIP() << "this GPU cannot run the kernels";
  for (const testing::Shape& shape :
       {testing::Shape{2, 130, 8, 2, 128, 0, 0}, testing::Shape{2, 200, 4, 2, 64, 5, 45}}) {
    const testing::Batch batch = testing::random_batch(shape, 99);
    const std::size_t rows = batch.rows();
    const std::size_t ld = batch.qkv_width();
    std::vector<__nv_bfloat16> qkv_host(batch.qkv.size());
    for (std::size_t i = 0; i < qkv_host.size(); ++i) qkv_host[i] = testing::to_bf16(batch.qkv[i]);
    testing::DeviceArray<__nv_bfloat16> qkv(qkv_host);
    testing::DeviceArray<std::uint32_t> first_key(batch.first_key);
    testing::DeviceArray<float> out32(rows * batch.q_width());
    testing::DeviceArray<__nv_bfloat16> out16(rows * batch.q_width());
    const std::size_t lse_floats = shape.sequences * shape.heads * shape.positions;
    testing::DeviceArray<float> lse32(lse_floats), lse16(lse_floats);
    out32.poison();
    out16.poison();
    lse32.poison();
    lse16.poison();
    const AttentionDims dims{shape.sequences, shape.positions, shape.heads, shape.kv_heads,
                             shape.head_dim,  shape.window,    first_key.get()};
    const Bf16Rows q{qkv.get(), ld}, k{qkv.get() + batch.k_offset(), ld},
        v{qkv.get() + batch.v_offset(), ld};
    ASSERT_EQ(flash_attention_forward(dims, q, k, v, FloatRows{out32.get(), batch.q_width()},
                                      lse32.get(), nullptr),
              cudaSuccess);
    ASSERT_EQ(flash_attention_forward(dims, q, k, v, Bf16MutRows{out16.get(), batch.q_width()},
                                      lse16.get(), nullptr),
              cudaSuccess);
    const std::vector<float> expected = out32.download();
    const std::vector<__nv_bfloat16> actual = out16.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const __nv_bfloat16 rounded = testing::to_bf16(expected[i]);
      if (std::memcmp(&rounded, &actual[i], sizeof(rounded)) != 0 && ++bad <= 3) {
        ADD_FAILURE() << "out[" << i << "]: " << __bfloat162float(actual[i]) << ", fp32 "
                      << expected[i];
      }
    }
    EXPECT_EQ(bad, 0u) << shape_name(shape);
    const std::vector<float> lse_a = lse32.download(), lse_b = lse16.download();
    EXPECT_EQ(std::memcmp(lse_a.data(), lse_b.data(), lse_a.size() * sizeof(float)), 0);
  }
}

// Shapes the kernels do not take are refused before any launch (cudaErrorInvalidValue, so the
// decoder can fall back instead of reading out of bounds); empty work succeeds.
TEST(FlashAttentionCudaLimits, UnsupportedShapesAreRefused) {
  const std::string reason = tiers::cuda_unavailable_reason();
  if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
  if (!flash_attention_supported(64, 0)) GTEST_SKIP() << "this GPU cannot run the kernels";
  EXPECT_TRUE(flash_attention_supported(128, 0));
  EXPECT_TRUE(flash_attention_supported(8, 0));
  for (const std::size_t head_dim : {0, 10, 100, 136, 256}) {
    EXPECT_FALSE(flash_attention_supported(static_cast<std::size_t>(head_dim), 0)) << head_dim;
  }
  testing::DeviceArray<float> floats(4096);
  testing::DeviceArray<__nv_bfloat16> halves(4096);
  testing::DeviceArray<std::uint32_t> first_key(64);
  float* f = floats.get();
  const __nv_bfloat16* h = halves.get();
  const auto forward = [&](AttentionDims dims) {
    return flash_attention_forward(dims, f, f, f, 64, f, 64, f, halves.get(), nullptr);
  };
  EXPECT_EQ(forward({1, 8, 1, 1, 10, 0, first_key.get()}), cudaErrorInvalidValue);
  EXPECT_EQ(forward({1, 8, 1, 1, 136, 0, first_key.get()}), cudaErrorInvalidValue);
  EXPECT_EQ(forward({1, 8, 3, 2, 16, 0, first_key.get()}), cudaErrorInvalidValue);  // GQA
  EXPECT_EQ(forward({0, 8, 1, 1, 10, 0, first_key.get()}), cudaSuccess);            // nothing to do
  const AttentionDims dims{1, 8, 1, 1, 16, 0, first_key.get()};
  EXPECT_EQ(flash_attention_forward(dims, {h + 1, 16}, {h, 16}, {h, 16}, {f, 16}, f, nullptr),
            cudaErrorInvalidValue);  // q not 16-byte aligned
  EXPECT_EQ(flash_attention_forward(dims, {h, 16}, {h, 12}, {h, 16}, {f, 16}, f, nullptr),
            cudaErrorInvalidValue);  // k's rows not 16-byte aligned
  EXPECT_EQ(flash_attention_backward(dims, {h, 16}, {h, 16}, {h, 16}, {h, 16}, {h + 4, 16}, f, f,
                                     {f, 16}, {f, 16}, {f, 16}, nullptr),
            cudaErrorInvalidValue);            // v not 16-byte aligned
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing was launched
}

}  // namespace
}  // namespace strata::llm::cuda
