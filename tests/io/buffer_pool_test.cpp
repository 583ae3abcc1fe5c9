// Proves the aligned buffer pool lends each buffer to one holder at a time, aligned for O_DIRECT,
// blocks acquire() until a lease returns, and gets every buffer back from RAII leases.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include "io/buffer_pool.hpp"

namespace strata::io {
namespace {

TEST(AlignedBufferTest, IsAlignedRoundedAndZeroed) {
  AlignedBuffer buffer = AlignedBuffer::allocate(5000);
  EXPECT_EQ(buffer.size(), 8192U);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % kDirectIoAlignment, 0U);
  for (std::byte b : buffer.span()) {
    ASSERT_EQ(b, std::byte{0});
  }
  AlignedBuffer moved = std::move(buffer);
  EXPECT_TRUE(buffer.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(moved.size(), 8192U);
}

TEST(BufferPoolTest, LendsDistinctAlignedBuffersUntilEmpty) {
  BufferPool pool(3, 10000);
  EXPECT_EQ(pool.buffer_bytes(), 12288U);
  std::vector<BufferPool::Lease> leases;
  std::set<std::uint32_t> indices;
  for (int i = 0; i < 3; ++i) {
    std::optional<BufferPool::Lease> lease = pool.try_acquire();
    ASSERT_TRUE(lease.has_value());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(lease->data()) % kDirectIoAlignment, 0U);
    EXPECT_EQ(lease->data(), pool.buffer(lease->index()).data());
    indices.insert(lease->index());
    leases.push_back(std::move(*lease));
  }
  EXPECT_EQ(indices.size(), 3U);
  EXPECT_FALSE(pool.try_acquire().has_value());
  leases.pop_back();
  EXPECT_EQ(pool.free_count(), 1U);
  EXPECT_TRUE(pool.try_acquire().has_value());  // returned again at once by the temporary
  leases.clear();
  EXPECT_EQ(pool.free_count(), 3U);
}

TEST(BufferPoolTest, AcquireWaitsForARelease) {
  BufferPool pool(1, 4096);
  std::optional<BufferPool::Lease> held = pool.acquire();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    held.reset();
  });
  BufferPool::Lease second = pool.acquire();  // would hang forever if release did not wake it
  EXPECT_TRUE(second.valid());
  releaser.join();
}

TEST(BufferPoolTest, PoisonKnobFillsReturnedBuffers) {
  ::setenv("STRATA_POISON_BUFFERS", "1", 1);
  BufferPool pool(1, 4096);
  ::unsetenv("STRATA_POISON_BUFFERS");
  std::byte* data = nullptr;
  {
    BufferPool::Lease lease = pool.acquire();
    data = lease.data();
    std::fill(data, data + 4096, std::byte{0x11});
  }
  for (std::size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(data[i], std::byte{0xDE}) << "byte " << i;
  }
}

}  // namespace
}  // namespace strata::io
