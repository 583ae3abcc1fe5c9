// BufferPool: a fixed number of equal, 4 KiB-aligned buffers allocated once, lent out as RAII
// leases. An engine can register the pool's buffers with its rings (io_uring fixed buffers); a
// request then names its buffer by index() so the kernel skips pinning the pages on every I/O.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "io/aligned_buffer.hpp"

namespace strata::io {

class BufferPool {
 public:
  class Lease;

  // buffer_bytes is rounded up to 4 KiB. All memory is allocated here, none later.
  BufferPool(std::size_t buffer_count, std::size_t buffer_bytes);
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  // Every lease must have been returned (asserted): a lease outliving its pool is a use-after-free.
  ~BufferPool();

  // Blocks until a buffer is free. Thread-safe.
  Lease acquire();
  // Returns nullopt when every buffer is lent out. Thread-safe.
  std::optional<Lease> try_acquire();

  std::size_t buffer_count() const noexcept { return buffer_count_; }
  std::size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  std::size_t free_count() const;
  // The whole buffer `index`, leased or not.
  std::span<std::byte> buffer(std::uint32_t index) const noexcept;
  // Every buffer in index order: IoEngineOptions::fixed_buffers, so that Lease::index() is the
  // fixed-buffer index.
  std::vector<std::span<std::byte>> buffers() const;

 private:
  void release(std::uint32_t index) noexcept;

  std::size_t buffer_count_;
  std::size_t buffer_bytes_;
  bool poison_on_release_;
  AlignedBuffer memory_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::uint32_t> free_;  // a stack of free indices; capacity fixed at construction
};

// A borrowed buffer; returns to its pool when destroyed. Move-only.
class BufferPool::Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  std::span<std::byte> span() const noexcept { return pool_->buffer(index_); }
  std::byte* data() const noexcept { return span().data(); }
  std::size_t size() const noexcept { return pool_->buffer_bytes(); }
  // The buffer's index in its pool, which is also its fixed-buffer index in a registered ring.
  std::uint32_t index() const noexcept { return index_; }
  bool valid() const noexcept { return pool_ != nullptr; }

 private:
  friend class BufferPool;
  Lease(BufferPool* pool, std::uint32_t index) : pool_(pool), index_(index) {}

  BufferPool* pool_ = nullptr;
  std::uint32_t index_ = 0;
};

}  // namespace strata::io
