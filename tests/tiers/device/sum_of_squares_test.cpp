// Proves Stream::sum_of_squares on every backend: the device's sum of squares of a gradient is
// cpu_adam's (GradNormAccumulator fed the same spans in the same order) bit for bit, for fp32, bf16
// and fp16 at sizes around every edge of the norm's fixed shape (lanes, blocks, leaves, the tree
// depths the GPU computes in parallel), and an inf or NaN anywhere makes it non-finite.
#include <gtest/gtest.h>

#include <oneapi/tbb/task_arena.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/float16.hpp"
#include "cpu_adam/grad_norm.hpp"
#include "tests/tiers/device/optimizer_case.hpp"
#include "tests/tiers/device_backends.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {
namespace {

using testing::DeviceBackendTest;

constexpr std::uint64_t kBlock = cpu_adam::kNormBlockElems;

class DeviceSumOfSquaresTest : public DeviceBackendTest {
 protected:
  // Sizes: lanes and rows (1, 31, 32, 33), one block and one past it, a leaf of 8 blocks and one
  // past it, trees of depth 1 to 6; on a GPU also one whose parallel depth is the deepest (10).
  std::vector<std::uint64_t> sizes() const {
    std::vector<std::uint64_t> sizes = {1,
                                        31,
                                        32,
                                        33,
                                        kBlock,
                                        kBlock + 1,
                                        8 * kBlock,
                                        9 * kBlock,
                                        17 * kBlock + 5,
                                        1000 * kBlock + 17};
    if (GetParam() == DeviceKind::kCuda) sizes.push_back(5000 * kBlock + 3);
    return sizes;
  }

  // *sum on the device after adding every span of `spans` (host bytes of `dtype`) in order.
  double device_sum(Device& device, DType dtype, const std::vector<std::vector<std::byte>>& spans,
                    double start) {
    Stream stream = device.create_stream();
    DeviceBuffer sum = device.allocate(sizeof(double));
    stream.copy_to_device(sum.span(), &start);
    std::vector<DeviceBuffer> inputs;
    std::uint64_t largest = 0;
    for (const auto& span : spans) largest = std::max<std::uint64_t>(largest, span.size());
    DeviceBuffer scratch =
        device.allocate(std::max<std::uint64_t>(8, sum_of_squares_scratch_bytes(largest)));
    for (const auto& span : spans) {
      inputs.push_back(device.allocate(span.size()));
      stream.copy_to_device(inputs.back().span(), span.data());
      stream.sum_of_squares(inputs.back().span(), dtype, sum.span(), scratch.span());
    }
    double result = 0;
    stream.copy_to_host(&result, sum.span());
    stream.synchronize();
    return result;
  }
};

TEST_P(DeviceSumOfSquaresTest, EqualsCpuAdamBitForBit) {
  const std::uint64_t seed = testing::test_seed();
  auto device = make(2ull << 30);
  tbb::task_arena arena;
  for (DType dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    for (std::uint64_t count : sizes()) {
      if (GetParam() == DeviceKind::kCuda && count > 100 * kBlock && dtype == DType::kFp32) {
        continue;  // the deepest tree once per 16-bit type is enough
      }
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " x " + std::to_string(count) + ", seed " +
                   std::to_string(seed) + " (STRATA_TEST_SEED)");
      const std::vector<std::byte> grads = testing::random_grads(dtype, count, seed + count);
      cpu_adam::GradNormAccumulator reference;
      reference.add(cpu_adam::ConstTypedSpan(grads.data(), count, dtype), arena);
      const double device_result = device_sum(*device, dtype, {grads}, 0.0);
      ASSERT_EQ(std::bit_cast<std::uint64_t>(device_result),
                std::bit_cast<std::uint64_t>(reference.sum_of_squares()))
          << device_result << " against " << reference.sum_of_squares();
    }
  }
}

TEST_P(DeviceSumOfSquaresTest, SpansAddInStreamOrderAsTheAccumulatorAddsThem) {
  const std::uint64_t seed = testing::test_seed();
  auto device = make(256ull << 20);
  tbb::task_arena arena;
  const std::vector<std::vector<std::byte>> spans = {
      testing::random_grads(DType::kBf16, 3 * kBlock + 7, seed),
      testing::random_grads(DType::kBf16, 5, seed + 1),
      testing::random_grads(DType::kBf16, 40 * kBlock + 1, seed + 2)};
  cpu_adam::GradNormAccumulator reference;
  for (const auto& span : spans) {
    reference.add(cpu_adam::ConstTypedSpan(span.data(), span.size() / 2, DType::kBf16), arena);
  }
  const double device_result = device_sum(*device, DType::kBf16, spans, 0.0);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(device_result),
            std::bit_cast<std::uint64_t>(reference.sum_of_squares()))
      << "seed " << seed;
  // An empty span adds nothing, even to a running sum.
  EXPECT_EQ(device_sum(*device, DType::kFp32, {{}}, 2.5), 2.5);
}

TEST_P(DeviceSumOfSquaresTest, AnInfOrNanAnywhereMakesTheSumNonFinite) {
  auto device = make(64ull << 20);
  constexpr std::uint64_t kCount = 3 * kBlock + 100;
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    for (const std::uint64_t where : {std::uint64_t{0}, kBlock + 17, kCount - 1}) {
      std::vector<float> grads(kCount, 0.5f);
      grads[where] = bad;
      std::vector<std::byte> bytes(kCount * sizeof(float));
      std::memcpy(bytes.data(), grads.data(), bytes.size());
      EXPECT_FALSE(std::isfinite(device_sum(*device, DType::kFp32, {bytes}, 0.0)))
          << bad << " at " << where;
    }
  }
  std::vector<std::byte> finite(kCount * sizeof(float));
  const std::vector<float> large(kCount, 3e38f);  // the largest squares still fit a double
  std::memcpy(finite.data(), large.data(), finite.size());
  EXPECT_TRUE(std::isfinite(device_sum(*device, DType::kFp32, {finite}, 0.0)));
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceSumOfSquaresTest, testing::device_kinds(),
                         testing::device_kind_test_name);

}  // namespace
}  // namespace strata::tiers
