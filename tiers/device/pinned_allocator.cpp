// mmap + mlock host allocator with a warn-once fallback to pageable memory.
#include "tiers/device/pinned_allocator.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "io/huge_page_memory.hpp"

namespace strata::tiers {

HostAllocationError::HostAllocationError(int error_number, const std::string& operation,
                                         std::uint64_t bytes)
    : std::system_error(error_number, std::generic_category(),
                        fmt::format("{} of {} bytes of host memory", operation, bytes)) {}

MmapPinnedAllocator::MmapPinnedAllocator(MmapPinnedAllocatorOptions options)
    : options_(std::move(options)) {
  if (!options_.lock_pages) {
    options_.lock_pages = [](const void* data, std::size_t bytes) { return ::mlock(data, bytes); };
  }
  if (!options_.warn) {
    options_.warn = [](std::string_view message) {
      std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
    };
  }
}

std::byte* map_host_pages(std::uint64_t bytes) {
  STRATA_ASSERT(bytes > 0);
  const std::uint64_t length = round_up(bytes, kPinnedAlignment);
  std::byte* data = nullptr;
  try {
    data = io::map_huge_page_backed(length);
  } catch (const std::bad_alloc&) {
    throw HostAllocationError(ENOMEM, "mmap", length);
  }
  io::populate(data, length);
  return data;
}

std::byte* MmapPinnedAllocator::allocate(std::uint64_t bytes) {
  const std::uint64_t length = round_up(bytes, kPinnedAlignment);
  std::byte* data = map_host_pages(bytes);
  if (options_.mlock == MlockPolicy::kTry && options_.lock_pages(data, length) != 0) {
    const int error_number = errno;
    mlock_failures_.fetch_add(1);
    if (!warned_.exchange(true)) {
      options_.warn(fmt::format(
          "strata: warning: mlock of {} bytes failed ({}); pinned host memory stays pageable "
          "(raise `ulimit -l` or grant CAP_IPC_LOCK). Shown once.",
          length, std::strerror(error_number)));
    }
  }
  return data;
}

void MmapPinnedAllocator::free(std::byte* data, std::uint64_t bytes) noexcept {
  // munmap also unlocks. It fails only for a bad address, which is a programmer error.
  io::unmap_huge_page_backed(data, round_up(bytes, kPinnedAlignment));
}

}  // namespace strata::tiers
