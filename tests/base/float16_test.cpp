// Proves base/float16.hpp's conversions: fp32 -> bf16/fp16 rounds to nearest even (ties, overflow
// to infinity, subnormals, NaN kept a NaN with its sign) against independent references, and every
// one of the 2^16 bf16 and fp16 codes widens exactly (fp16 bit for bit like F16C and the compiler's
// _Float16). The one rounding test of strata: every layer converts with these functions.
#include "base/float16.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.hpp"
#include "tests/base/float16_reference.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata {
namespace {

using float16_reference::cast_inputs;
using float16_reference::Format;
using float16_reference::is_nan_code;
using float16_reference::kBf16;
using float16_reference::kFp16;
using float16_reference::kNanInputs;
using float16_reference::reference_bf16_bits;
using float16_reference::reference_decode;
using float16_reference::reference_round;
using float16_reference::seed_note;
using float16_reference::test_seed;

float from_bits(std::uint32_t bits) {
  return std::bit_cast<float>(bits);
}

std::uint32_t to_bits(float value) {
  return std::bit_cast<std::uint32_t>(value);
}

// The conversions are constexpr: usable in tables and static checks.
static_assert(to_bf16(1.0f).bits == 0x3f80 && to_fp16(1.0f).bits == 0x3c00);
static_assert(to_float(Bf16{0x3fc0}) == 1.5f && to_float(Fp16{0x3e00}) == 1.5f);

// --- Narrowing: known values, ties, overflow, subnormals, NaN ------------------------------------

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
  const std::uint64_t seed = test_seed(7);
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int k = 0; k < 2'000'000; ++k) {
    std::uint32_t bits = static_cast<std::uint32_t>(rng());
    if (k % 4 == 0) bits = (bits & 0xFFFF'0000u) | 0x8000u;  // exact ties
    const float value = from_bits(bits);
    ASSERT_EQ(to_bf16(value).bits, reference_bf16_bits(value)) << std::hex << bits;
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


// --- Against a second reference (exact distances) and the compiler's _Float16 --------------------

// Independent bf16 reference: pick the nearer of the two bf16 neighbours by exact double
// arithmetic, the one with an even mantissa on a tie.
std::uint16_t reference_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto truncated = static_cast<std::uint16_t>(bits >> 16);
  if ((bits & 0xffffu) == 0) return truncated;
  const auto up = static_cast<std::uint16_t>(truncated + 1);  // next in magnitude, same sign
  const double low_value = std::bit_cast<float>(static_cast<std::uint32_t>(truncated) << 16);
  // Past the largest finite bf16 the next neighbour is 2^128 (IEEE overflow rounding), encoded as
  // inf.
  const double high_value = (up & 0x7fffu) == 0x7f80u
                                ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(value))
                                : std::bit_cast<float>(static_cast<std::uint32_t>(up) << 16);
  const double low_distance = std::fabs(static_cast<double>(value) - low_value);
  const double high_distance = std::fabs(high_value - static_cast<double>(value));
  if (low_distance < high_distance) return truncated;
  if (high_distance < low_distance) return up;
  return (truncated & 1u) == 0 ? truncated : up;
}

std::vector<float> interesting_floats(std::uint32_t seed) {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               65536.0f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               0x1p-24f,
                               0x1p-25f,
                               0x1.8p-25f,
                               0x1p-26f,
                               0x1.ffcp-15f,
                               0x1.ffep-15f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
  std::mt19937 random(seed);
  for (int i = 0; i < 200000; ++i)
    values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(random())));
  for (int i = 0; i < 100000; ++i) {  // around the fp16 range, where rounding decisions matter
    std::uniform_real_distribution<float> around(-70000.0f, 70000.0f);
    values.push_back(around(random) * std::ldexp(1.0f, static_cast<int>(random() % 30) - 28));
  }
  return values;
}

TEST(DtypeTest, Bf16RoundsToNearestEvenLikeTheReference) {
  const std::uint32_t seed = 20261129;
  for (float value : interesting_floats(seed)) {
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(to_float(to_bf16(value)))) << "seed " << seed;
      continue;
    }
    ASSERT_EQ(to_bf16(value).bits, reference_bf16(value))
        << "value " << std::hexfloat << value << " seed " << seed;
  }
}

TEST(DtypeTest, Bf16TiesGoToEven) {
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f).bits, to_bf16(1.0f).bits);  // tie, 1.0 is even
  EXPECT_EQ(to_bf16(1.0f + 0x1p-7f + 0x1p-8f).bits,
            to_bf16(1.0f + 0x1p-6f).bits);                              // tie, up to even
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80u);  // rounds to infinity
}

TEST(DtypeTest, Bf16ToFloatIsExactForEveryPattern) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const Bf16 value{static_cast<std::uint16_t>(bits)};
    const float widened = to_float(value);
    if (std::isnan(widened)) continue;
    ASSERT_EQ(to_bf16(widened).bits, bits);
  }
}

#if defined(__FLT16_MAX__)
TEST(DtypeTest, Fp16MatchesTheCompilersFloat16) {
  const std::uint32_t seed = 7;
  for (float value : interesting_floats(seed)) {
    const auto reference = static_cast<_Float16>(value);
    std::uint16_t reference_bits = 0;
    std::memcpy(&reference_bits, &reference, sizeof(reference_bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(to_float(to_fp16(value))));
      continue;
    }
    ASSERT_EQ(to_fp16(value).bits, reference_bits)
        << "value " << std::hexfloat << value << " seed " << seed;
  }
}

TEST(DtypeTest, Fp16ToFloatMatchesTheCompilerForEveryPattern) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto half_bits = static_cast<std::uint16_t>(bits);
    _Float16 reference;
    std::memcpy(&reference, &half_bits, sizeof(reference));
    const float expected = static_cast<float>(reference);
    const float widened = to_float(Fp16{half_bits});
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(widened)) << bits;
      continue;
    }
    ASSERT_EQ(std::bit_cast<std::uint32_t>(widened), std::bit_cast<std::uint32_t>(expected))
        << bits;
    ASSERT_EQ(to_fp16(widened).bits, half_bits);
  }
}
#else
TEST(DtypeTest, Fp16MatchesTheCompilersFloat16) {
  GTEST_SKIP() << "compiler has no _Float16";
}
#endif

TEST(DtypeTest, Fp16MidpointsRoundToEven) {
  // Every midpoint between adjacent positive finite fp16 values rounds to the even neighbour.
  for (std::uint16_t bits = 0; bits < 0x7bffu; ++bits) {
    const double low = to_float(Fp16{bits});
    const double high = to_float(Fp16{static_cast<std::uint16_t>(bits + 1)});
    const auto midpoint = static_cast<float>((low + high) / 2);  // exact in fp32
    const std::uint16_t even = (bits & 1u) == 0 ? bits : static_cast<std::uint16_t>(bits + 1);
    ASSERT_EQ(to_fp16(midpoint).bits, even) << bits;
  }
}

// --- Against the search reference, over every tie of both formats -------------------------------

TEST(CastReferenceTest, ScalarConversionsMatchTheReference) {
  const std::uint64_t seed = test_seed(20261129u);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const float value : cast_inputs(seed)) {
    ASSERT_EQ(to_bf16(value).bits, reference_round(kBf16, value)) << std::hexfloat << value;
    ASSERT_EQ(to_fp16(value).bits, reference_round(kFp16, value)) << std::hexfloat << value;
  }
  for (const std::uint32_t bits : kNanInputs) {
    const std::uint16_t bf16 = to_bf16(from_bits(bits)).bits;
    const std::uint16_t fp16 = to_fp16(from_bits(bits)).bits;
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
      const float widened = is_bf16 ? to_float(Bf16{half}) : to_float(Fp16{half});
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

// --- Round trips through fp32 --------------------------------------------------------------------

TEST(HalfFloat, EveryFp16AndBf16ValueRoundTripsThroughFp32) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float from_fp16 = to_float(Fp16{half});
    if (!std::isnan(from_fp16)) {
      ASSERT_EQ(to_fp16(from_fp16).bits, half) << "fp16 0x" << std::hex << bits;
    }
    const float from_bf16 = to_float(Bf16{half});
    if (!std::isnan(from_bf16)) {
      ASSERT_EQ(to_bf16(from_bf16).bits, half) << "bf16 0x" << std::hex << bits;
    }
  }
}

TEST(HalfFloat, RoundsToNearestEvenAndSaturatesToInfinity) {
  EXPECT_EQ(to_fp16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_fp16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(to_fp16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(to_fp16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(to_fp16(-1e9f).bits, 0xfc00);
  EXPECT_EQ(to_fp16(0x1p-24f).bits, 0x0001);
  EXPECT_EQ(to_fp16(0x1p-25f).bits, 0x0000);         // tie: to even (zero)
  EXPECT_EQ(to_fp16(0x1.8p-24f).bits, 0x0002);       // tie: to even (2)
  EXPECT_EQ(to_fp16(1.0f + 0x1p-11f).bits, 0x3c00);  // tie: to even
  EXPECT_EQ(to_fp16(1.0f + 0x3p-11f).bits, 0x3c02);  // tie: to even
  EXPECT_TRUE(std::isnan(to_float(to_fp16(std::nanf("")))));
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f).bits, 0x3f80);  // tie: to even
  EXPECT_EQ(to_bf16(1.0f + 0x3p-8f).bits, 0x3f82);  // tie: to even
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
}

TEST(Float16Nan, KeepsSignTopPayloadAndSetsTheQuietBit) {
  EXPECT_EQ(to_bf16(from_bits(0x7f80'0001u)).bits, 0x7fc0);  // signalling, payload in low bits
  EXPECT_EQ(to_bf16(from_bits(0xffc1'2345u)).bits, 0xffc1);
  EXPECT_EQ(to_fp16(from_bits(0x7f80'0001u)).bits, 0x7e00);
  EXPECT_EQ(to_fp16(from_bits(0xffc1'2345u)).bits, 0xfe09);  // top 10 payload bits kept
  EXPECT_EQ(to_bits(to_float(Fp16{0x7c01})), 0x7fc0'2000u);  // quietened, like F16C
  EXPECT_EQ(to_bits(to_float(Bf16{0x7f81})), 0x7f81'0000u);  // bf16 widening is the bits as is
}

// --- The element type ----------------------------------------------------------------------------

TEST(Dtypes, NamesRoundTrip) {
  for (DType dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    EXPECT_EQ(parse_floating_dtype(dtype_name(dtype)), dtype);
  }
  EXPECT_FALSE(parse_floating_dtype("fp8").has_value());
  EXPECT_EQ(dtype_bytes(DType::kBf16), 2u);
}

TEST(Dtypes, IntegerTypesAreNamedSizedAndNeverParsedAsPrecisions) {
  EXPECT_EQ(dtype_name(DType::kUint8), "uint8");
  EXPECT_EQ(dtype_name(DType::kUint64), "uint64");
  EXPECT_EQ(dtype_bytes(DType::kUint8), 1u);
  EXPECT_EQ(dtype_bytes(DType::kUint64), 8u);
  EXPECT_EQ(dtype_bytes(DType::kFp32), 4u);
  EXPECT_FALSE(parse_floating_dtype("uint8").has_value());
  EXPECT_FALSE(parse_floating_dtype("FP32").has_value());
  EXPECT_TRUE(is_floating_point(DType::kFp16));
  EXPECT_FALSE(is_floating_point(DType::kUint64));
  static_assert(dtype_v<float> == DType::kFp32 && dtype_v<Bf16> == DType::kBf16 &&
                dtype_v<Fp16> == DType::kFp16 && dtype_v<std::uint8_t> == DType::kUint8 &&
                dtype_v<std::uint64_t> == DType::kUint64);
}

}  // namespace
}  // namespace strata
