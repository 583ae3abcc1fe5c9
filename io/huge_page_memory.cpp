#include "io/huge_page_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>

#include "base/assert.hpp"
#include "base/units.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL and we touch the pages
#endif

namespace strata::io {

std::byte* map_huge_page_backed(std::size_t length_bytes) {
  STRATA_ASSERT(length_bytes > 0);
  // Over-map by one huge page, then trim both ends so the mapping starts on a 2 MiB boundary
  // (a huge page can only back an aligned 2 MiB range).
  const std::size_t mapped = length_bytes + kHugePageBytes;
  void* raw = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto begin = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(begin, std::uintptr_t{kHugePageBytes});
  const std::uintptr_t end = begin + mapped;
  const std::uintptr_t aligned_end = aligned + round_up(length_bytes, kDirectIoAlignment);
  if (aligned > begin) ::munmap(raw, aligned - begin);
  if (end > aligned_end) ::munmap(reinterpret_cast<void*>(aligned_end), end - aligned_end);
  auto* data = reinterpret_cast<std::byte*>(aligned);
  // Advice only: EINVAL where the kernel has no THP; the memory works the same, just slower I/O.
  ::madvise(data, aligned_end - aligned, MADV_HUGEPAGE);
  return data;
}

void unmap_huge_page_backed(std::byte* data, std::size_t length_bytes) noexcept {
  const int result = ::munmap(data, round_up(length_bytes, kDirectIoAlignment));
  STRATA_ASSERT(result == 0, "munmap of a huge-page-backed buffer failed");
}

void populate(std::byte* data, std::size_t length_bytes) noexcept {
  if (::madvise(data, length_bytes, MADV_POPULATE_WRITE) == 0) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t offset = 0; offset < length_bytes; offset += page) {
    // A volatile write: the compiler may not drop it, and the zero it writes is already there.
    *reinterpret_cast<volatile std::byte*>(data + offset) = std::byte{0};
  }
}

}  // namespace strata::io
