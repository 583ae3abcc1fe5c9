// Proves the fp32 <-> bf16/fp16 casts are bit-exact against an independent round-to-nearest-even
// reference (nearest representable value by search, ties to the even code) on every backend,
// including NaN, inf, overflow, denormals and exact ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/tiers/device_backends.hpp"
#include "tiers/device/detail/half_convert.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {
namespace {

using testing::DeviceBackendTest;

// A binary format with 1 sign bit, `exponent_bits`, `mantissa_bits` (bf16: 8/7, fp16: 5/10).
struct Format {
  int exponent_bits;
  int mantissa_bits;
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  std::uint16_t inf_code() const {
    return static_cast<std::uint16_t>(((1u << exponent_bits) - 1u) << mantissa_bits);
  }
  // The magnitude of a non-negative code, by the textbook formula. inf_code() decodes as the next
  // power of two past the largest finite value, which is where rounding to inf starts.
  double magnitude(std::uint16_t code) const {
    const int exponent = code >> mantissa_bits;
    const int mantissa = code & ((1 << mantissa_bits) - 1);
    if (exponent == 0) {
      return std::ldexp(static_cast<double>(mantissa), 1 - bias() - mantissa_bits);
    }
    return std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -mantissa_bits),
                      exponent - bias());
  }
};

constexpr Format kBf16{8, 7};
constexpr Format kFp16{5, 10};

float from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

std::uint32_t to_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Reference for finite and infinite inputs (NaNs are checked separately).
std::uint16_t reference_round(const Format& format, float value) {
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  const std::uint16_t inf = format.inf_code();
  if (magnitude >= format.magnitude(inf)) {
    return sign | inf;
  }
  // Largest code whose magnitude is <= the input: codes are ordered like their magnitudes.
  std::uint16_t low = 0;
  std::uint16_t high = inf;  // invariant: magnitude(low) <= input < magnitude(high)
  while (high - low > 1) {
    const auto middle = static_cast<std::uint16_t>((low + high) / 2);
    (format.magnitude(middle) <= magnitude ? low : high) = middle;
  }
  const double below = magnitude - format.magnitude(low);  // exact in double
  const double above = format.magnitude(high) - magnitude;
  std::uint16_t nearest = below < above ? low : high;
  if (below == above) {
    nearest = (low & 1u) == 0 ? low : high;
  }
  return sign | nearest;
}

float reference_decode(const Format& format, std::uint16_t code) {
  const double magnitude = format.magnitude(code & 0x7fff);
  return static_cast<float>((code & 0x8000) != 0 ? -magnitude : magnitude);
}

bool is_nan_code(const Format& format, std::uint16_t code) {
  const std::uint16_t inf = format.inf_code();
  return (code & inf) == inf && (code & ((1u << format.mantissa_bits) - 1u)) != 0;
}

// Special values, every exact midpoint between neighbouring codes of both formats (the ties) and
// the floats just around them, and seeded random bit patterns.
std::vector<float> cast_inputs(std::uint64_t seed) {
  std::vector<float> inputs = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::denorm_min(),
                               from_bits(0x007fffff),
                               65504.0f,
                               65519.996f,
                               65520.0f,
                               -65520.0f,
                               65536.0f,
                               1e10f,
                               std::ldexp(1.0f, -24),
                               std::ldexp(1.0f, -25),
                               std::ldexp(3.0f, -26),
                               std::ldexp(1.5f, -24),
                               std::ldexp(1.0f, -14),
                               std::ldexp(1023.0f, -24),
                               std::ldexp(2047.0f, -25),
                               1.0f + std::ldexp(1.0f, -8),
                               1.0f + std::ldexp(3.0f, -8),
                               1.0f + std::ldexp(1.0f, -11),
                               1.0f + std::ldexp(3.0f, -11)};
  for (const Format& format : {kBf16, kFp16}) {
    for (std::uint32_t code = 0; code + 1 < format.inf_code(); ++code) {
      const double middle = (format.magnitude(static_cast<std::uint16_t>(code)) +
                             format.magnitude(static_cast<std::uint16_t>(code + 1))) /
                            2;
      const float tie = static_cast<float>(middle);
      if (static_cast<double>(tie) != middle) {
        continue;  // not representable in fp32 (below fp32's denormals): no tie to test
      }
      for (const float value : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e38f)}) {
        inputs.push_back(value);
        inputs.push_back(-value);
      }
    }
  }
  std::mt19937 random(static_cast<std::uint32_t>(seed));
  for (int i = 0; i < 100000; ++i) {
    const float value = from_bits(random());
    if (!std::isnan(value)) {
      inputs.push_back(value);
    }
  }
  return inputs;
}

const std::vector<std::uint32_t> kNanInputs = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                               0x7fbfffffu, 0x7fc12345u, 0xffffffffu};

TEST(CastReferenceTest, ScalarConversionsMatchTheReference) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const float value : cast_inputs(seed)) {
    ASSERT_EQ(detail::fp32_to_bf16(value), reference_round(kBf16, value)) << std::hexfloat << value;
    ASSERT_EQ(detail::fp32_to_fp16(value), reference_round(kFp16, value)) << std::hexfloat << value;
  }
  for (const std::uint32_t bits : kNanInputs) {
    const std::uint16_t bf16 = detail::fp32_to_bf16(from_bits(bits));
    const std::uint16_t fp16 = detail::fp32_to_fp16(from_bits(bits));
    EXPECT_TRUE(is_nan_code(kBf16, bf16)) << std::hex << bits;
    EXPECT_TRUE(is_nan_code(kFp16, fp16)) << std::hex << bits;
    EXPECT_EQ(bf16 & 0x8000u, (bits >> 16) & 0x8000u);
    EXPECT_EQ(fp16 & 0x8000u, (bits >> 16) & 0x8000u);
  }
}

TEST(CastReferenceTest, EveryHalfCodeWidensExactly) {
  for (std::uint32_t code = 0; code <= 0xffff; ++code) {
    const auto half = static_cast<std::uint16_t>(code);
    for (const bool is_bf16 : {true, false}) {
      const Format& format = is_bf16 ? kBf16 : kFp16;
      const float widened = is_bf16 ? detail::bf16_to_fp32(half) : detail::fp16_to_fp32(half);
      if (is_nan_code(format, half)) {
        ASSERT_TRUE(std::isnan(widened)) << std::hex << code;
        continue;
      }
      const bool inf = (half & 0x7fff) == format.inf_code();
      const float expected =
          inf ? ((half & 0x8000) != 0 ? -INFINITY : INFINITY) : reference_decode(format, half);
      ASSERT_EQ(to_bits(widened), to_bits(expected)) << std::hex << code;
    }
  }
}

class DeviceCastTest : public DeviceBackendTest {};

TEST_P(DeviceCastTest, CastKernelsAreBitExact) {
  const std::uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<float> inputs = cast_inputs(seed);
  for (const std::uint32_t bits : kNanInputs) {
    inputs.push_back(from_bits(bits));
  }
  const std::uint64_t count = inputs.size();
  auto device = make();
  Stream stream = device->create_stream();
  DeviceBuffer wide = device->allocate(count * 4);
  DeviceBuffer narrow = device->allocate(count * 2);
  DeviceBuffer widened = device->allocate(count * 4);
  stream.copy_to_device(wide.span(), inputs.data());

  for (const DType type : {DType::kBFloat16, DType::kFloat16}) {
    const Format& format = type == DType::kBFloat16 ? kBf16 : kFp16;
    std::vector<std::uint16_t> codes(count);
    std::vector<float> back(count);
    stream.cast(narrow.span(), type, wide.span(), DType::kFloat32);
    stream.cast(widened.span(), DType::kFloat32, narrow.span(), type);
    stream.copy_to_host(codes.data(), narrow.span());
    stream.copy_to_host(back.data(), widened.span());
    stream.synchronize();
    for (std::uint64_t i = 0; i < count; ++i) {
      const float value = inputs[i];
      if (std::isnan(value)) {
        ASSERT_TRUE(is_nan_code(format, codes[i])) << dtype_name(type) << " " << i;
        ASSERT_TRUE(std::isnan(back[i]));
        continue;
      }
      ASSERT_EQ(codes[i], reference_round(format, value))
          << dtype_name(type) << " of " << std::hexfloat << value;
      const std::uint16_t code = codes[i];
      const bool inf = (code & 0x7fff) == format.inf_code();
      const float expected =
          inf ? ((code & 0x8000) != 0 ? -INFINITY : INFINITY) : reference_decode(format, code);
      ASSERT_EQ(to_bits(back[i]), to_bits(expected)) << dtype_name(type) << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceCastTest, testing::device_kinds(),
                         testing::device_kind_test_name);

}  // namespace
}  // namespace strata::tiers
