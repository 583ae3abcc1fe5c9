// Proves the device cast kernels (host loops and CUDA) are bit-exact against an independent
// round-to-nearest-even reference (nearest representable value by search, ties to the even code) on
// every backend, including NaN, inf, overflow, denormals and exact ties. The scalar conversions
// they run are proven in tests/base/float16_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/base/float16_reference.hpp"
#include "tests/tiers/device_backends.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {
namespace {

using testing::DeviceBackendTest;

using float16_reference::cast_inputs;
using float16_reference::Format;
using float16_reference::is_nan_code;
using float16_reference::kBf16;
using float16_reference::kFp16;
using float16_reference::kNanInputs;
using float16_reference::reference_decode;
using float16_reference::reference_round;

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

  for (const DType type : {DType::kBf16, DType::kFp16}) {
    const Format& format = type == DType::kBf16 ? kBf16 : kFp16;
    std::vector<std::uint16_t> codes(count);
    std::vector<float> back(count);
    stream.cast(narrow.span(), type, wide.span(), DType::kFp32);
    stream.cast(widened.span(), DType::kFp32, narrow.span(), type);
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
