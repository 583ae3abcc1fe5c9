// PinnedAllocator: where page-locked host memory comes from. The pinned pool
// (tiers/pinned_pool.hpp) budgets and hands it out; the device decides how it is made
// (Device::pinned_allocator()): mmap + cudaHostRegister for a CUDA device, mmap + mlock otherwise. Keeps
// tiers/ code free of CUDA.
//
// Contract: allocate() returns memory aligned to kPinnedAlignment (4 KiB: O_DIRECT-ready) of at
// least the requested bytes, or throws; free() takes back exactly what allocate() gave, with the
// same byte count. Both are slow (system calls, page faults): call them at start-up, not per step.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>

namespace strata::tiers {

inline constexpr std::size_t kPinnedAlignment = 4096;

class PinnedAllocator {
 public:
  virtual ~PinnedAllocator() = default;
  virtual std::byte* allocate(std::uint64_t bytes) = 0;
  virtual void free(std::byte* data, std::uint64_t bytes) noexcept = 0;
  virtual std::string_view name() const = 0;
};

// A host allocation that the system refused (mmap, cudaHostRegister). Names the call and the size.
class HostAllocationError : public std::system_error {
 public:
  HostAllocationError(int error_number, const std::string& operation, std::uint64_t bytes);
};

// `bytes` rounded up to kPinnedAlignment of anonymous, huge-page backed memory (io/
// huge_page_memory.hpp: the pool's NVMe staging reaches the disk in far fewer requests), every
// page faulted in now, at start-up, not on the first copy. Throws HostAllocationError (ENOMEM).
// Both pinned allocators map their memory here; unmap with io::unmap_huge_page_backed.
std::byte* map_host_pages(std::uint64_t bytes);

enum class MlockPolicy { kOff, kTry };

struct MmapPinnedAllocatorOptions {
  MlockPolicy mlock = MlockPolicy::kTry;
  // Seams for tests: how pages are locked, and where the one warning goes (default: stderr).
  std::function<int(const void*, std::size_t)> lock_pages;
  std::function<void(std::string_view)> warn;
};

// Anonymous private mmap, pre-faulted, and mlock'ed when the process may (MlockPolicy::kOff:
// never, for `[tiers.host] pinned = false`). A failed mlock is not an
// error (the memory still works, only pageable): it prints one warning per allocator, the first
// time, and counts every failure.
class MmapPinnedAllocator final : public PinnedAllocator {
 public:
  explicit MmapPinnedAllocator(MmapPinnedAllocatorOptions options = {});
  std::byte* allocate(std::uint64_t bytes) override;
  void free(std::byte* data, std::uint64_t bytes) noexcept override;
  // "mmap" (pages locked when the process may), or "mmap (pageable)" with MlockPolicy::kOff.
  std::string_view name() const override {
    return options_.mlock == MlockPolicy::kOff ? "mmap (pageable)" : "mmap";
  }

  std::uint64_t mlock_failures() const { return mlock_failures_.load(); }

 private:
  MmapPinnedAllocatorOptions options_;
  std::atomic<std::uint64_t> mlock_failures_{0};
  std::atomic<bool> warned_{false};
};

}  // namespace strata::tiers
