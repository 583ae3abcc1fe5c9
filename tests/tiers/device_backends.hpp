// Shared by the device tests: the backends to run every typed test on, and the skip rule.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "base/debug_knobs.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers::testing {

// HostDevice always; CudaDevice whenever strata was built with CUDA (skipped without a GPU).
inline auto device_kinds() {
#if defined(STRATA_HAVE_CUDA)
  return ::testing::Values(DeviceKind::kHost, DeviceKind::kCuda);
#else
  return ::testing::Values(DeviceKind::kHost);
#endif
}

inline std::string device_kind_test_name(const ::testing::TestParamInfo<DeviceKind>& info) {
  return std::string(device_kind_name(info.param));
}

// Seed for randomized tests: STRATA_TEST_SEED when set, else a fixed default. Print it on failure.
inline std::uint64_t test_seed() {
  return test_seed_knob().value_or(20261129u);
}

class DeviceBackendTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::kCuda) {
      const std::string reason = cuda_unavailable_reason();
      if (!reason.empty()) {
        GTEST_SKIP() << "no usable CUDA device: " << reason;
      }
    }
  }

  std::unique_ptr<Device> make(std::uint64_t budget_bytes = 64ull << 20,
                               PoisonOnRelease poison = PoisonOnRelease::kOff,
                               std::size_t stream_queue_depth = 1024) const {
    DeviceOptions options;
    options.kind = GetParam();
    options.budget_bytes = budget_bytes;
    options.poison = poison;
    options.stream_queue_depth = stream_queue_depth;
    return make_device(options);
  }
};

}  // namespace strata::tiers::testing
