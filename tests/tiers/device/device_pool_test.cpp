// Proves the device memory pool on every backend: released blocks are reused by size with no
// backend call, pooled bytes give way to a request that needs the budget, and in use + pooled never
// passes the budget.
#include <gtest/gtest.h>

#include <vector>

#include "base/units.hpp"
#include "tests/tiers/device_backends.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {
namespace {

class DevicePoolTest : public testing::DeviceBackendTest {};

TEST_P(DevicePoolTest, SameSizesAreReusedWithoutBackendCalls) {
  auto device = make(4 * kMiB);
  for (int step = 0; step < 5; ++step) {
    std::vector<DeviceBuffer> buffers;
    for (const std::uint64_t bytes : {64 * kKiB, std::uint64_t{100}, 64 * kKiB, 300 * kKiB}) {
      buffers.push_back(device->allocate(bytes));
    }
    // Every step allocates the same four sizes; only the first reaches the backend.
    EXPECT_EQ(device->backend_allocation_count(), 4u) << "step " << step;
  }
  EXPECT_EQ(device->in_use_bytes(), 0u);
  EXPECT_EQ(device->pooled_bytes(), 2 * 64 * kKiB + kDeviceAllocationGranularity + 300 * kKiB);
  EXPECT_EQ(device->backend_free_count(), 0u);
}

TEST_P(DevicePoolTest, PooledBytesGiveWayToABudgetedRequest) {
  auto device = make(1 * kMiB);
  device->allocate(512 * kKiB).reset();
  device->allocate(256 * kKiB).reset();
  EXPECT_EQ(device->pooled_bytes(), 768 * kKiB);
  // 768 KiB does not fit beside the pool: the largest pooled block (512 KiB) goes first, and that
  // is enough.
  DeviceBuffer big = device->allocate(768 * kKiB);
  EXPECT_EQ(device->backend_free_count(), 1u);
  EXPECT_EQ(device->pooled_bytes(), 256 * kKiB);
  EXPECT_LE(device->in_use_bytes() + device->pooled_bytes(), device->budget_bytes());
  // Past the budget counting only the bytes in use: refused, as without a pool.
  EXPECT_THROW((void)device->allocate(512 * kKiB), DeviceBudgetError);
  big.reset();
  DeviceBuffer whole = device->allocate(1 * kMiB);  // the whole budget: the pool is emptied
  EXPECT_EQ(device->pooled_bytes(), 0u);
  EXPECT_EQ(device->in_use_bytes(), 1 * kMiB);
}

TEST_P(DevicePoolTest, ReleasePoolReturnsEverything) {
  auto device = make(1 * kMiB);
  device->allocate(128 * kKiB).reset();
  device->allocate(64 * kKiB).reset();
  device->release_pool();
  EXPECT_EQ(device->pooled_bytes(), 0u);
  EXPECT_EQ(device->backend_free_count(), 2u);
  device->allocate(128 * kKiB).reset();
  EXPECT_EQ(device->backend_allocation_count(), 3u);  // nothing pooled: a fresh backend call
}

TEST_P(DevicePoolTest, QuarantinedBlocksAreNotReusedUntilTheyLeaveIt) {
  // With poison on, a released block first waits in the quarantine (64 KiB here), so a stale read
  // still shows poison; only blocks pushed out of the quarantine are handed out again.
  DeviceOptions options;
  options.kind = GetParam();
  options.budget_bytes = 1 * kMiB;
  options.poison = PoisonOnRelease::kOn;
  options.poison_quarantine_bytes = 64 * kKiB;
  auto device = make_device(options);
  DeviceBuffer first = device->allocate(64 * kKiB);
  std::byte* const first_address = first.data();
  first.reset();
  DeviceBuffer second = device->allocate(64 * kKiB);
  EXPECT_NE(second.data(), first_address);  // still quarantined
  second.reset();                           // pushes `first` out of the quarantine into the pool
  DeviceBuffer third = device->allocate(64 * kKiB);
  EXPECT_EQ(third.data(), first_address);
  EXPECT_EQ(device->backend_allocation_count(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Backends, DevicePoolTest, testing::device_kinds(),
                         testing::device_kind_test_name);

}  // namespace
}  // namespace strata::tiers
