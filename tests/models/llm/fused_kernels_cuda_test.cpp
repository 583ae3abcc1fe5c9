// Proves the bf16 decoder's element-wise, norm and loss kernels (fused_kernels.hpp) against host
// references on widths that cross their 8-element chunks and 4-element groups (odd widths, widths
// not a multiple of 8, padded row strides, rows held in registers and rows too wide for them):
// data movement exact, arithmetic within fp32 and bf16 rounding, and every kernel's
// element-by-element path (inputs shifted one element off 16-byte alignment) bitwise equal to
// its 16-byte path. Outputs start poisoned (NaN); padding must stay so. Skips without CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "models/decoder/cuda_device_array.hpp"
#include "models/decoder/decoder_cuda_base.hpp"
#include "models/decoder/fused_kernels.hpp"
#include "models/decoder/mlp_kernels.hpp"
#include "tiers/device/device.hpp"

namespace strata::llm::cuda {
namespace {

using bf16 = __nv_bfloat16;

// Elements a placed array starts past cudaMalloc's alignment: 0 takes the kernels' 16-byte
// accesses, 1 their element-by-element path.
constexpr std::size_t kShifts[] = {0, 1};

float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

std::vector<float> random_floats(std::size_t count, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  return values;
}
std::vector<bf16> to_bf16(const std::vector<float>& values) {
  std::vector<bf16> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __float2bfloat16_rn(values[i]);
  return out;
}
std::vector<float> to_float(const std::vector<bf16>& values) {
  std::vector<float> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = __bfloat162float(values[i]);
  return out;
}
template <typename T>
T poison() {
  T value;
  std::memset(static_cast<void*>(&value), 0xff, sizeof(T));
  return value;
}

// Host data on the device `shift` elements past a 16-byte boundary (the elements before it
// poisoned too).
template <typename T>
class Placed {
 public:
  Placed(const std::vector<T>& host, std::size_t shift)
      : array_(host.size() + shift), shift_(shift) {
    std::vector<T> padded(shift, poison<T>());
    padded.insert(padded.end(), host.begin(), host.end());
    array_.upload(padded);
  }
  Placed(std::size_t count, std::size_t shift)
      : Placed(std::vector<T>(count, poison<T>()), shift) {}
  T* get() const { return array_.get() + shift_; }
  std::vector<T> download() const {
    const std::vector<T> all = array_.download();
    return {all.begin() + static_cast<std::ptrdiff_t>(shift_), all.end()};
  }

 private:
  DeviceArray<T> array_;
  std::size_t shift_;
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <typename T>
bool is_poison(T value) {
  const T p = poison<T>();
  return std::memcmp(&value, &p, sizeof(T)) == 0;
}

// Counts elements outside rel·|want| + abs and reports the first few.
void expect_near(const std::vector<float>& got, const std::vector<double>& want, double rel,
                 double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = rel * std::fabs(want[i]) + abs;
    if (!(std::fabs(got[i] - want[i]) <= bound)) {  // NaN fails
      if (++bad <= 3) ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

// A bf16 output: its rounding (half an ulp of 8 bits, 2⁻⁹) on top of fp32 error.
constexpr double kBf16Rel = 1.0 / 128;
constexpr double kFp32Rel = 1e-5;

class FusedKernelsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = tiers::cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
  static void sync() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
};

// --- casts and biases ----------------------------------------------------------------------------

TEST_F(FusedKernelsCuda, RoundToBf16IsExactAtEveryLengthAndPlacement) {
  for (const std::size_t count : {1u, 7u, 8u, 9u, 1001u, 4101u}) {
    const std::vector<float> src = random_floats(count, count, 3.0f);
    for (const std::size_t shift : kShifts) {
      Placed<float> in(src, shift);
      Placed<bf16> out(count + 1, shift);
      check_cuda(round_to_bf16(in.get(), out.get(), count, nullptr), "round_to_bf16");
      sync();
      const std::vector<bf16> got = out.download();
      EXPECT_TRUE(same_bits(std::vector<bf16>(got.begin(), got.end() - 1), to_bf16(src)))
          << count << " elements, shift " << shift;
      EXPECT_TRUE(is_poison(got.back())) << "wrote past the end";
    }
  }
}

TEST_F(FusedKernelsCuda, WidenToFp32IsExactOnPaddedRows) {
  const std::size_t rows = 5;
  for (const std::size_t cols : {3u, 61u, 64u}) {
    for (const std::size_t pad : {0u, 3u}) {
      const std::size_t ld_src = cols + pad, ld_dst = cols + 2 * pad;
      const std::vector<bf16> src = to_bf16(random_floats(rows * ld_src, cols + pad));
      for (const std::size_t shift : kShifts) {
        Placed<bf16> in(src, shift);
        Placed<float> out(rows * ld_dst, shift);
        check_cuda(widen_to_fp32(in.get(), ld_src, out.get(), ld_dst, rows, cols, nullptr),
                   "widen_to_fp32");
        sync();
        const std::vector<float> got = out.download();
        for (std::size_t r = 0; r < rows; ++r) {
          for (std::size_t c = 0; c < ld_dst; ++c) {
            const float value = got[r * ld_dst + c];
            if (c < cols) {
              ASSERT_EQ(value, __bfloat162float(src[r * ld_src + c])) << r << "," << c;
            } else {
              ASSERT_TRUE(is_poison(value)) << "padding written at " << r << "," << c;
            }
          }
        }
      }
    }
  }
}

TEST_F(FusedKernelsCuda, AddRowBiasIsOneAddPerElementInBothTypes) {
  const std::size_t rows = 6;
  for (const std::size_t cols : {5u, 40u, 67u}) {
    for (const std::size_t ld : {cols, cols + 3}) {
      const std::vector<float> d = random_floats(rows * ld, cols * ld);
      const std::vector<float> bias = random_floats(cols, cols + 1);
      const std::vector<bf16> d16 = to_bf16(d), bias16 = to_bf16(bias);
      for (const std::size_t shift : kShifts) {
        Placed<float> d32(d, shift), b32(bias, shift);
        Placed<bf16> dbf(d16, shift), bbf(bias16, shift);
        check_cuda(add_row_bias(d32.get(), ld, rows, cols, b32.get(), nullptr), "add_row_bias");
        check_cuda(add_row_bias(dbf.get(), ld, rows, cols, bbf.get(), nullptr), "add_row_bias");
        sync();
        const std::vector<float> got32 = d32.download();
        const std::vector<bf16> got16 = dbf.download();
        for (std::size_t r = 0; r < rows; ++r) {
          for (std::size_t c = 0; c < ld; ++c) {
            const std::size_t e = r * ld + c;
            const bool in = c < cols;
            ASSERT_EQ(got32[e], in ? d[e] + bias[c] : d[e]) << r << "," << c;
            const float want16 =
                in ? round_bf16(__bfloat162float(d16[e]) + __bfloat162float(bias16[c]))
                   : __bfloat162float(d16[e]);
            ASSERT_EQ(__bfloat162float(got16[e]), want16) << r << "," << c;
          }
        }
      }
    }
  }
}

// --- norms ---------------------------------------------------------------------------------------

// Widths: groups of 4 in registers (100, 2048; 4096 forward only), element-wise (61, 5000).
const std::size_t kNormDims[] = {61, 100, 2048, 4096, 5000};
constexpr std::size_t kNormRows = 7;
constexpr float kEps = 1e-5f;

enum class NormKind { kRms, kLayer };

// Elements the rows (x, dy, dx, y) and the parameters (weight, bias) start past alignment: rows
// shifted take the element-wise kernel, parameters alone the register kernel's scalar loads.
struct Shifts {
  std::size_t rows, parameters;
};
constexpr Shifts kNormShifts[] = {{1, 1}, {0, 1}};

struct NormForwardOut {
  std::vector<bf16> y;
  std::vector<float> mean, rstd;
};

NormForwardOut run_norm_forward(NormKind kind, const std::vector<float>& x,
                                const std::vector<float>& w, const std::vector<float>& b,
                                std::size_t dim, Shifts shift) {
  const std::size_t rows = x.size() / dim;
  Placed<float> dx(x, shift.rows), dw(w, shift.parameters), db(b, shift.parameters);
  Placed<float> mean(rows, 0), rstd(rows, 0);
  Placed<bf16> y(rows * dim, shift.rows);
  check_cuda(norm_forward_bf16(dx.get(), dw.get(), kind == NormKind::kLayer ? db.get() : nullptr,
                               y.get(), mean.get(), rstd.get(), rows, dim, kEps, nullptr),
             "norm_forward_bf16");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return {y.download(), mean.download(), rstd.download()};
}

// The row's mean (0 for RMSNorm) and rstd in double.
std::pair<double, double> norm_statistics(NormKind kind, const float* row, std::size_t dim) {
  double mu = 0;
  if (kind == NormKind::kLayer) {
    for (std::size_t i = 0; i < dim; ++i) mu += row[i];
    mu /= static_cast<double>(dim);
  }
  double sq = 0;
  for (std::size_t i = 0; i < dim; ++i) sq += (row[i] - mu) * (row[i] - mu);
  return {mu, 1.0 / std::sqrt(sq / static_cast<double>(dim) + kEps)};
}

TEST_F(FusedKernelsCuda, NormForwardMatchesDoubleOnEveryWidth) {
  for (const NormKind kind : {NormKind::kRms, NormKind::kLayer}) {
    for (const std::size_t dim : kNormDims) {
      SCOPED_TRACE(testing::Message()
                   << "dim " << dim << (kind == NormKind::kRms ? " rms" : " ln"));
      const std::vector<float> x = random_floats(kNormRows * dim, dim, 2.0f);
      const std::vector<float> w = random_floats(dim, dim + 1), b = random_floats(dim, dim + 2);
      const NormForwardOut aligned = run_norm_forward(kind, x, w, b, dim, {0, 0});
      for (const Shifts shift : kNormShifts) {
        const NormForwardOut other = run_norm_forward(kind, x, w, b, dim, shift);
        EXPECT_TRUE(same_bits(aligned.y, other.y) && same_bits(aligned.mean, other.mean) &&
                    same_bits(aligned.rstd, other.rstd))
            << "rows shifted " << shift.rows << ", parameters " << shift.parameters;
      }
      std::vector<double> want_y(x.size()), want_mean(kNormRows), want_rstd(kNormRows);
      for (std::size_t r = 0; r < kNormRows; ++r) {
        const auto [mu, s] = norm_statistics(kind, &x[r * dim], dim);
        want_mean[r] = mu;
        want_rstd[r] = s;
        for (std::size_t i = 0; i < dim; ++i) {
          want_y[r * dim + i] =
              (x[r * dim + i] - mu) * s * w[i] + (kind == NormKind::kLayer ? b[i] : 0);
        }
      }
      expect_near(to_float(aligned.y), want_y, kBf16Rel, 1e-5, "y");
      expect_near(aligned.mean, want_mean, kFp32Rel, 1e-6, "mean");
      expect_near(aligned.rstd, want_rstd, kFp32Rel, 0, "rstd");
    }
  }
}

struct NormBackwardOut {
  std::vector<float> dx;
  std::vector<bf16> dx_bf16;
  std::vector<float> dweight, dbias;
};

struct NormBackwardCase {
  NormKind kind;
  std::size_t dim;
  std::vector<float> dy, x, w, dx0, mean, rstd;
};

NormBackwardOut run_norm_backward(const NormBackwardCase& c, DxUpdate update, Shifts shifts) {
  const std::size_t shift = shifts.rows;
  const std::size_t rows = c.x.size() / c.dim;
  const bool layer = c.kind == NormKind::kLayer;
  // kOverwrite must not read dx: it starts poisoned then.
  Placed<float> dy(c.dy, shift), x(c.x, shift), w(c.w, shifts.parameters), mean(c.mean, 0);
  Placed<float> rstd(c.rstd, 0);
  Placed<float> dx(
      update == DxUpdate::kAccumulate ? c.dx0 : std::vector<float>(c.dx0.size(), poison<float>()),
      shift);
  Placed<bf16> dx16(c.x.size(), shift);
  Placed<float> dweight(c.dim, shift), dbias(c.dim, shift);
  check_cuda(norm_backward_bf16(dy.get(), x.get(), layer ? mean.get() : nullptr, rstd.get(),
                                w.get(), dx.get(), dx16.get(), dweight.get(),
                                layer ? dbias.get() : nullptr, rows, c.dim, update, nullptr),
             "norm_backward_bf16");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return {dx.download(), dx16.download(), dweight.download(), dbias.download()};
}

// dx0 + the input gradient, dweight and dbias in double (norm_kernels.cpp's formulas).
void norm_backward_reference(const NormBackwardCase& c, std::vector<double>& dx,
                             std::vector<double>& dweight, std::vector<double>& dbias,
                             std::vector<double>& magnitude) {
  const std::size_t dim = c.dim, rows = c.x.size() / dim;
  dx.assign(c.x.size(), 0);
  dweight.assign(dim, 0);
  dbias.assign(dim, 0);
  magnitude.assign(dim, 0);
  for (std::size_t r = 0; r < rows; ++r) {
    const double mu = c.kind == NormKind::kLayer ? c.mean[r] : 0.0, s = c.rstd[r];
    const float *g = &c.dy[r * dim], *in = &c.x[r * dim];
    double a = 0, b = 0;  // Σ dxhat, Σ dxhat·xhat (xhat = (x - mu)·s)
    for (std::size_t i = 0; i < dim; ++i) {
      a += g[i] * c.w[i];
      b += g[i] * c.w[i] * (in[i] - mu) * s;
    }
    for (std::size_t i = 0; i < dim; ++i) {
      const double xhat = (in[i] - mu) * s;
      const double grad = c.kind == NormKind::kLayer
                              ? s * (g[i] * c.w[i] - a / dim - xhat * b / dim)
                              : s * (g[i] * c.w[i] - xhat * b / dim);
      dx[r * dim + i] = c.dx0[r * dim + i] + grad;
      dweight[i] += g[i] * xhat;
      dbias[i] += g[i];
      magnitude[i] += std::fabs(g[i] * xhat) + std::fabs(g[i]);
    }
  }
}

TEST_F(FusedKernelsCuda, NormBackwardMatchesDoubleAndRoundsItsOwnDx) {
  for (const NormKind kind : {NormKind::kRms, NormKind::kLayer}) {
    for (const std::size_t dim : kNormDims) {
      SCOPED_TRACE(testing::Message()
                   << "dim " << dim << (kind == NormKind::kRms ? " rms" : " ln"));
      NormBackwardCase c{kind,
                         dim,
                         random_floats(kNormRows * dim, 3 * dim),
                         random_floats(kNormRows * dim, 3 * dim + 1, 2.0f),
                         random_floats(dim, 5),
                         random_floats(kNormRows * dim, 3 * dim + 2),
                         {},
                         {}};
      for (std::size_t r = 0; r < kNormRows; ++r) {
        const auto [mu, s] = norm_statistics(kind, &c.x[r * dim], dim);
        c.mean.push_back(static_cast<float>(mu));
        c.rstd.push_back(static_cast<float>(s));
      }
      const NormBackwardOut aligned = run_norm_backward(c, DxUpdate::kAccumulate, {0, 0});
      for (const Shifts shift : kNormShifts) {
        const NormBackwardOut other = run_norm_backward(c, DxUpdate::kAccumulate, shift);
        EXPECT_TRUE(same_bits(aligned.dx, other.dx) && same_bits(aligned.dx_bf16, other.dx_bf16) &&
                    same_bits(aligned.dweight, other.dweight))
            << "rows shifted " << shift.rows << ", parameters " << shift.parameters;
      }
      EXPECT_TRUE(same_bits(aligned.dx_bf16, to_bf16(aligned.dx))) << "dx_bf16 is not bf16(dx)";
      std::vector<double> dx, dweight, dbias, magnitude;
      norm_backward_reference(c, dx, dweight, dbias, magnitude);
      expect_near(aligned.dx, dx, 1e-4, 1e-4, "dx");
      for (std::size_t i = 0; i < dim; ++i) {
        ASSERT_NEAR(aligned.dweight[i], dweight[i], 1e-5 * magnitude[i] + 1e-6) << "dweight " << i;
        if (kind == NormKind::kLayer) {
          ASSERT_NEAR(aligned.dbias[i], dbias[i], 1e-5 * magnitude[i] + 1e-6) << "dbias " << i;
        }
      }
      // Overwriting a poisoned dx gives what accumulating into zeros gives, bit for bit (the head's
      // backward relies on it instead of a memset).
      NormBackwardCase zeroed = c;
      std::fill(zeroed.dx0.begin(), zeroed.dx0.end(), 0.0f);
      for (const std::size_t shift : kShifts) {
        const NormBackwardOut over = run_norm_backward(c, DxUpdate::kOverwrite, {shift, shift});
        const NormBackwardOut add =
            run_norm_backward(zeroed, DxUpdate::kAccumulate, {shift, shift});
        EXPECT_TRUE(same_bits(over.dx, add.dx) && same_bits(over.dx_bf16, add.dx_bf16))
            << "kOverwrite, shift " << shift;
      }
    }
  }
}

// --- RoPE ----------------------------------------------------------------------------------------

// q | k heads rotated, then v's columns (untouched), then padding: half 64 (the Llama's), 12 (not
// a whole number of chunks), 5 (odd).
struct RopeCase {
  std::size_t rows = 9, heads = 3, half, positions = 16, pad;
  std::size_t cols() const { return 2 * heads * half + 2 * half; }
  std::size_t ld() const { return cols() + pad; }
  std::vector<float> cos, sin;
  std::vector<std::uint32_t> row_positions;

  RopeCase(std::size_t half_, std::size_t pad_) : half(half_), pad(pad_) {
    cos = random_floats(positions * half, 7 * half);
    sin = random_floats(positions * half, 7 * half + 1);
    std::mt19937_64 rng(half);
    for (std::size_t r = 0; r < rows; ++r) row_positions.push_back(rng() % positions);
  }
  // (c, s) of row r's pair i.
  std::pair<double, double> angle(std::size_t r, std::size_t i) const {
    return {cos[row_positions[r] * half + i], sin[row_positions[r] * half + i]};
  }
};

std::vector<bf16> run_rope_forward(const RopeCase& c, const std::vector<bf16>& x,
                                   std::size_t shift) {
  Placed<bf16> dx(x, shift);
  Placed<float> cos(c.cos, shift), sin(c.sin, shift);
  DeviceArray<std::uint32_t> positions(c.row_positions);
  check_cuda(rope_forward_bf16(dx.get(), c.ld(), c.rows, c.heads, c.half, positions.get(),
                               cos.get(), sin.get(), nullptr),
             "rope_forward_bf16");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return dx.download();
}

TEST_F(FusedKernelsCuda, RopeForwardRotatesTheHeadsAndNothingElse) {
  for (const std::size_t half : {64u, 12u, 5u}) {
    for (const std::size_t pad : {0u, 3u}) {
      SCOPED_TRACE(testing::Message() << "half " << half << ", pad " << pad);
      const RopeCase c(half, pad);
      const std::vector<bf16> x = to_bf16(random_floats(c.rows * c.ld(), half + pad));
      const std::vector<bf16> got = run_rope_forward(c, x, 0);
      EXPECT_TRUE(same_bits(got, run_rope_forward(c, x, 1))) << "element-wise path differs";
      std::vector<double> want(x.size());
      for (std::size_t e = 0; e < x.size(); ++e) want[e] = __bfloat162float(x[e]);
      for (std::size_t r = 0; r < c.rows; ++r) {
        for (std::size_t h = 0; h < c.heads; ++h) {
          for (std::size_t i = 0; i < half; ++i) {
            const std::size_t e1 = r * c.ld() + h * 2 * half + i, e2 = e1 + half;
            const auto [cs, sn] = c.angle(r, i);
            const double a = __bfloat162float(x[e1]), b = __bfloat162float(x[e2]);
            want[e1] = a * cs - b * sn;
            want[e2] = b * cs + a * sn;
          }
        }
      }
      expect_near(to_float(got), want, kBf16Rel, 1e-5, "x");
      for (std::size_t r = 0; r < c.rows; ++r) {  // v and padding: the same bits
        for (std::size_t col = 2 * c.heads * half; col < c.ld(); ++col) {
          ASSERT_TRUE(same_bits(std::vector<bf16>{got[r * c.ld() + col]},
                                std::vector<bf16>{x[r * c.ld() + col]}))
              << r << "," << col;
        }
      }
    }
  }
}

struct RopeBackwardOut {
  std::vector<float> dx;
  std::vector<bf16> out;
};

RopeBackwardOut run_rope_backward(const RopeCase& c, const std::vector<float>& dx,
                                  std::size_t shift) {
  Placed<float> d(dx, shift), cos(c.cos, shift), sin(c.sin, shift);
  Placed<bf16> out(dx.size(), shift);
  DeviceArray<std::uint32_t> positions(c.row_positions);
  check_cuda(rope_backward_to_bf16(d.get(), out.get(), c.ld(), c.rows, c.cols(), c.heads, c.half,
                                   positions.get(), cos.get(), sin.get(), nullptr),
             "rope_backward_to_bf16");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return {d.download(), out.download()};
}

TEST_F(FusedKernelsCuda, RopeBackwardRotatesBackCopiesTheRestAndRoundsItsOwnResult) {
  for (const std::size_t half : {64u, 12u, 5u}) {
    for (const std::size_t pad : {0u, 3u}) {
      SCOPED_TRACE(testing::Message() << "half " << half << ", pad " << pad);
      const RopeCase c(half, pad);
      const std::vector<float> dx = random_floats(c.rows * c.ld(), 11 * half + pad);
      const RopeBackwardOut got = run_rope_backward(c, dx, 0);
      const RopeBackwardOut shifted = run_rope_backward(c, dx, 1);
      EXPECT_TRUE(same_bits(got.dx, shifted.dx) && same_bits(got.out, shifted.out))
          << "element-wise path differs";
      std::vector<double> want(dx.begin(), dx.end());
      for (std::size_t r = 0; r < c.rows; ++r) {
        for (std::size_t h = 0; h < c.heads; ++h) {
          for (std::size_t i = 0; i < half; ++i) {
            const std::size_t e1 = r * c.ld() + h * 2 * half + i, e2 = e1 + half;
            const auto [cs, sn] = c.angle(r, i);
            want[e1] = dx[e1] * cs + dx[e2] * sn;
            want[e2] = dx[e2] * cs - dx[e1] * sn;
          }
        }
      }
      expect_near(got.dx, want, kFp32Rel, 1e-6, "dx");
      for (std::size_t r = 0; r < c.rows; ++r) {
        for (std::size_t col = 0; col < c.ld(); ++col) {
          const std::size_t e = r * c.ld() + col;
          if (col >= c.cols()) {
            ASSERT_TRUE(is_poison(got.out[e])) << "padding written at " << r << "," << col;
          } else {
            ASSERT_EQ(__bfloat162float(got.out[e]), round_bf16(got.dx[e])) << r << "," << col;
          }
          if (col >= 2 * c.heads * half) {
            ASSERT_EQ(got.dx[e], dx[e]) << "copied column changed";
          }
        }
      }
    }
  }
}

// --- MLP activations -----------------------------------------------------------------------------

constexpr Activation kActivations[] = {Activation::kSilu, Activation::kGeluTanh, Activation::kGelu};

template <class Run>
void expect_paths_agree_and_near(Run run, const std::vector<double>& want, const char* what) {
  const std::vector<bf16> aligned = run(0);
  EXPECT_TRUE(same_bits(aligned, run(1))) << what << ": element-wise path differs";
  expect_near(to_float(aligned), want, kBf16Rel, 1e-6, what);
}

std::vector<double> widen(const std::vector<float>& values) {
  return {values.begin(), values.end()};
}

TEST_F(FusedKernelsCuda, GatedMlpMatchesTheHostKernelsOnEveryWidth) {
  const std::size_t rows = 5;
  for (const Activation act : kActivations) {
    for (const std::size_t inner : {61u, 100u, 5632u}) {
      SCOPED_TRACE(testing::Message()
                   << "activation " << static_cast<int>(act) << ", inner " << inner);
      const std::vector<bf16> pre = to_bf16(random_floats(rows * 2 * inner, inner, 3.0f));
      const std::vector<bf16> dh = to_bf16(random_floats(rows * inner, inner + 1));
      const std::vector<float> pre32 = to_float(pre), dh32 = to_float(dh);
      std::vector<float> h(rows * inner), dpre(rows * 2 * inner);
      detail::gated_forward(act, pre32.data(), h.data(), rows, inner);
      detail::gated_backward(act, dh32.data(), pre32.data(), dpre.data(), rows, inner);
      const ActivationCode code = detail::activation_code(act);
      expect_paths_agree_and_near(
          [&](std::size_t shift) {
            Placed<bf16> in(pre, shift), out(rows * inner, shift);
            check_cuda(gated_forward_bf16(code, in.get(), out.get(), rows, inner, nullptr),
                       "gated_forward_bf16");
            return out.download();
          },
          widen(h), "h");
      expect_paths_agree_and_near(
          [&](std::size_t shift) {
            Placed<bf16> in(pre, shift), g(dh, shift), out(rows * 2 * inner, shift);
            check_cuda(
                gated_backward_bf16(code, g.get(), in.get(), out.get(), rows, inner, nullptr),
                "gated_backward_bf16");
            return out.download();
          },
          widen(dpre), "dpre");
    }
  }
}

TEST_F(FusedKernelsCuda, PlainMlpMatchesTheHostKernelsAtEveryLength) {
  for (const Activation act : kActivations) {
    for (const std::size_t count : {1u, 7u, 1001u, 4099u}) {
      SCOPED_TRACE(testing::Message()
                   << "activation " << static_cast<int>(act) << ", count " << count);
      const std::vector<bf16> pre = to_bf16(random_floats(count, count, 3.0f));
      const std::vector<bf16> dh = to_bf16(random_floats(count, count + 1));
      const std::vector<float> pre32 = to_float(pre), dh32 = to_float(dh);
      std::vector<float> h(count), dpre(count);
      detail::plain_forward(act, pre32.data(), h.data(), count);
      detail::plain_backward(act, dh32.data(), pre32.data(), dpre.data(), count);
      const ActivationCode code = detail::activation_code(act);
      expect_paths_agree_and_near(
          [&](std::size_t shift) {
            Placed<bf16> in(pre, shift), out(count, shift);
            check_cuda(plain_forward_bf16(code, in.get(), out.get(), count, nullptr),
                       "plain_forward_bf16");
            return out.download();
          },
          widen(h), "h");
      expect_paths_agree_and_near(
          [&](std::size_t shift) {
            Placed<bf16> in(pre, shift), g(dh, shift), out(count, shift);
            check_cuda(plain_backward_bf16(code, g.get(), in.get(), out.get(), count, nullptr),
                       "plain_backward_bf16");
            return out.download();
          },
          widen(dpre), "dpre");
    }
  }
}

// --- the loss ------------------------------------------------------------------------------------

struct LossOut {
  std::vector<float> lse;
  std::vector<double> row_loss;
  std::vector<bf16> dlogits;
};

LossOut run_loss(const std::vector<float>& logits, const std::vector<std::int32_t>& targets,
                 const std::vector<float>& weights, float inv_weight, std::size_t vocab,
                 std::size_t shift) {
  const std::size_t rows = targets.size();
  Placed<float> x(logits, shift), w(weights, 0), lse(rows, 0);
  Placed<double> loss(rows, 0);
  Placed<bf16> d(logits.size(), shift);
  DeviceArray<std::int32_t> t(targets);
  check_cuda(
      cross_entropy_forward(x.get(), t.get(), w.get(), lse.get(), loss.get(), rows, vocab, nullptr),
      "cross_entropy_forward");
  check_cuda(cross_entropy_backward(x.get(), lse.get(), t.get(), w.get(), inv_weight, d.get(), rows,
                                    vocab, nullptr),
             "cross_entropy_backward");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return {lse.download(), loss.download(), d.download()};
}

TEST_F(FusedKernelsCuda, CrossEntropyMatchesDoubleOnEveryVocabulary) {
  for (const std::size_t vocab : {1000u, 1001u, 32000u}) {
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    const std::vector<float> weights = {1.0f, 0.0f, 0.5f, 2.0f, 1.0f};  // row 1 masked
    const std::size_t rows = weights.size();
    const std::vector<float> logits = random_floats(rows * vocab, vocab, 6.0f);
    std::vector<std::int32_t> targets;
    for (std::size_t r = 0; r < rows; ++r)
      targets.push_back(static_cast<std::int32_t>((r * 7919) % vocab));
    const float inv_weight = 1.0f / 4.5f;
    const LossOut got = run_loss(logits, targets, weights, inv_weight, vocab, 0);
    const LossOut shifted = run_loss(logits, targets, weights, inv_weight, vocab, 1);
    EXPECT_TRUE(same_bits(got.lse, shifted.lse) && same_bits(got.row_loss, shifted.row_loss) &&
                same_bits(got.dlogits, shifted.dlogits))
        << "element-wise path differs";
    std::vector<double> want_d(logits.size());
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = &logits[r * vocab];
      double most = row[0], sum = 0;
      for (std::size_t i = 0; i < vocab; ++i) most = std::max<double>(most, row[i]);
      for (std::size_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - most);
      const double lse = most + std::log(sum);
      EXPECT_NEAR(got.lse[r], lse, 1e-5 * std::fabs(lse) + 1e-5) << "row " << r;
      const double loss = weights[r] == 0.0f ? 0.0 : lse - row[targets[r]];
      EXPECT_NEAR(got.row_loss[r], loss, 1e-4) << "row " << r;
      const double scale = static_cast<double>(weights[r]) * inv_weight;
      for (std::size_t i = 0; i < vocab; ++i) {
        // Against the device's own log-sum-exp, as the decoder's backward reads it.
        const double p = std::exp(row[i] - static_cast<double>(got.lse[r]));
        want_d[r * vocab + i] =
            scale * (p - (static_cast<std::int32_t>(i) == targets[r] ? 1.0 : 0.0));
      }
    }
    expect_near(to_float(got.dlogits), want_d, kBf16Rel, 1e-9, "dlogits");
    for (std::size_t i = 0; i < vocab; ++i) {
      ASSERT_EQ(__bfloat162float(got.dlogits[vocab + i]), 0.0f) << "masked row, column " << i;
    }
  }
}

}  // namespace
}  // namespace strata::llm::cuda
