// Proves I/O buffers of 2 MiB and more are 2 MiB aligned, zeroed, writable and advised for huge
// pages.
#include "io/huge_page_memory.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "io/aligned_buffer.hpp"

namespace strata::io {
namespace {

// The VmFlags line of the /proc/self/smaps entry that contains `address` ("" if none).
std::string vm_flags_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto wanted = reinterpret_cast<std::uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= wanted && wanted < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool has_flag(const std::string& flags, const std::string& flag) {
  return (flags + " ").find(" " + flag + " ") != std::string::npos;
}

TEST(HugePageMemory, MapsAlignedZeroedAdvisedMemory) {
  const std::size_t length = 3 * kHugePageBytes + 4096;
  std::byte* data = map_huge_page_backed(length);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(data) % kHugePageBytes, 0u);
  populate(data, length);
  for (std::size_t offset = 0; offset < length; offset += 4096) {
    ASSERT_EQ(data[offset], std::byte{0}) << "offset " << offset;
  }
  data[length - 1] = std::byte{7};
  const std::string flags = vm_flags_of(data);
  ASSERT_FALSE(flags.empty()) << "no smaps entry holds the mapping";
  // "hg": MADV_HUGEPAGE took (a kernel without transparent huge pages refuses the advice).
  if (!has_flag(flags, "hg")) GTEST_SKIP() << "the kernel refused MADV_HUGEPAGE: " << flags;
  unmap_huge_page_backed(data, length);
}

TEST(HugePageMemory, LargeAlignedBuffersAreHugePageBackedSmallOnesNot) {
  const AlignedBuffer large = AlignedBuffer::allocate(kHugePageBytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(large.size(), kHugePageBytes);
  EXPECT_EQ(large.data()[kHugePageBytes - 1], std::byte{0});
  const AlignedBuffer small = AlignedBuffer::allocate(kHugePageBytes / 2);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small.data()) % 4096, 0u);
  EXPECT_EQ(small.size(), kHugePageBytes / 2);
  const std::string large_flags = vm_flags_of(large.data());
  if (!has_flag(large_flags, "hg")) GTEST_SKIP() << "no MADV_HUGEPAGE here: " << large_flags;
  // A moved-from buffer is empty; the destination releases the mapping (ASan/LSan would see a
  // munmap/free mismatch).
  AlignedBuffer moved = AlignedBuffer::allocate(kHugePageBytes + 4096);
  AlignedBuffer target = std::move(moved);
  EXPECT_TRUE(moved.empty());
  EXPECT_EQ(target.size(), kHugePageBytes + 4096);
}

}  // namespace
}  // namespace strata::io
