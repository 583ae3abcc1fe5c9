// PinnedPool: the host memory used for staging copies and for host-homed state, within the host
// budget. Memory comes from a PinnedAllocator (Device::pinned_allocator(): mmap + cudaHostRegister on CUDA,
// mmap + mlock otherwise) and is handed out in two ways:
//   - allocate(bytes): a one-off PinnedBuffer for long-lived state;
//   - allocate_slab(count, bytes): N equal buffers made by one allocation at start-up, then leased
//     and returned on the hot path without any system call (staging rings, bounce buffers).
// Units: bytes. Alignment: every buffer and every lease starts on a 4 KiB boundary (O_DIRECT and
// SIMD ready); the budget counts round_up(bytes, 4 KiB) per buffer. Ownership: the pool outlives
// its buffers and slabs, a slab outlives its leases (both checked). Threading: all members are
// thread-safe; PinnedSlab::acquire blocks (condition variable) until a lease is returned.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tiers/device/pinned_allocator.hpp"
#include "tiers/device/poison.hpp"

namespace strata::tiers {

class PinnedPool;

// Allocation past the pool's budget. Names the budget, the bytes in use and the request.
class PinnedBudgetError : public std::runtime_error {
 public:
  PinnedBudgetError(std::uint64_t budget_bytes, std::uint64_t in_use_bytes,
                    std::uint64_t requested_bytes);
  std::uint64_t budget_bytes() const { return budget_bytes_; }
  std::uint64_t requested_bytes() const { return requested_bytes_; }

 private:
  std::uint64_t budget_bytes_;
  std::uint64_t requested_bytes_;
};

// Pinned host memory, move-only; returns its bytes to the pool's budget when destroyed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  std::byte* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }
  std::span<std::byte> span() const { return {data_, static_cast<std::size_t>(bytes_)}; }
  explicit operator bool() const { return pool_ != nullptr; }
  void reset() noexcept;

 private:
  friend class PinnedPool;
  PinnedBuffer(PinnedPool* pool, std::byte* data, std::uint64_t bytes)
      : pool_(pool), data_(data), bytes_(bytes) {}
  PinnedPool* pool_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

namespace detail {
struct SlabState;
}

// One buffer of a slab, move-only; goes back to the slab's free list when destroyed.
class PinnedLease {
 public:
  PinnedLease() = default;
  PinnedLease(PinnedLease&& other) noexcept;
  PinnedLease& operator=(PinnedLease&& other) noexcept;
  PinnedLease(const PinnedLease&) = delete;
  PinnedLease& operator=(const PinnedLease&) = delete;
  ~PinnedLease() { reset(); }

  std::byte* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }
  std::span<std::byte> span() const { return {data_, static_cast<std::size_t>(bytes_)}; }
  std::size_t index() const { return index_; }  // which buffer of the slab, 0 .. count-1
  explicit operator bool() const { return state_ != nullptr; }
  void reset() noexcept;

 private:
  friend class PinnedSlab;
  PinnedLease(detail::SlabState* state, std::size_t index, std::byte* data, std::uint64_t bytes)
      : state_(state), index_(index), data_(data), bytes_(bytes) {}
  detail::SlabState* state_ = nullptr;
  std::size_t index_ = 0;
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

// N buffers of S bytes from one allocation, leased out and returned. Move-only.
class PinnedSlab {
 public:
  PinnedSlab(PinnedSlab&&) noexcept;
  PinnedSlab& operator=(PinnedSlab&&) noexcept;
  ~PinnedSlab();

  PinnedLease acquire();                     // blocks until a buffer is free
  std::optional<PinnedLease> try_acquire();  // nullopt when all are leased
  std::size_t buffer_count() const;
  std::uint64_t buffer_bytes() const;
  std::size_t free_count() const;

 private:
  friend class PinnedPool;
  explicit PinnedSlab(std::unique_ptr<detail::SlabState> state);
  PinnedLease lease_front_locked();
  std::unique_ptr<detail::SlabState> state_;
};

class PinnedPool {
 public:
  // poison: slab leases are filled with kPoisonByte when returned (one-off buffers are unmapped on
  // release, so a stale access faults anyway).
  PinnedPool(std::shared_ptr<PinnedAllocator> allocator, std::uint64_t budget_bytes,
             PoisonOnRelease poison = PoisonOnRelease::kFromEnvironment);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Throws PinnedBudgetError past the budget, HostAllocationError if the system refuses.
  PinnedBuffer allocate(std::uint64_t bytes);
  PinnedSlab allocate_slab(std::size_t buffer_count, std::uint64_t buffer_bytes);

  std::string_view allocator_name() const { return allocator_->name(); }
  std::uint64_t budget_bytes() const { return budget_bytes_; }
  std::uint64_t in_use_bytes() const;
  std::uint64_t high_water_bytes() const;
  bool poisons_on_release() const { return poison_; }

 private:
  friend class PinnedBuffer;
  void release(std::byte* data, std::uint64_t bytes) noexcept;

  std::shared_ptr<PinnedAllocator> allocator_;
  const std::uint64_t budget_bytes_;
  const bool poison_;
  mutable std::mutex mutex_;  // guards the counters
  std::uint64_t in_use_bytes_ = 0;
  std::uint64_t high_water_bytes_ = 0;
  std::uint64_t live_buffers_ = 0;
};

namespace detail {

struct SlabState {
  PinnedBuffer backing;
  std::size_t buffer_count = 0;
  std::uint64_t buffer_bytes = 0;
  std::uint64_t stride_bytes = 0;
  bool poison = false;
  std::mutex mutex;  // guards free_indices
  std::condition_variable returned;
  std::vector<std::size_t> free_indices;
};

}  // namespace detail

}  // namespace strata::tiers
