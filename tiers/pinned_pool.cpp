// Pinned pool: budget accounting over a PinnedAllocator, and slabs leased without system calls.
#include "tiers/pinned_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/assert.hpp"
#include "base/units.hpp"

namespace strata::tiers {

PinnedBudgetError::PinnedBudgetError(std::uint64_t budget_bytes, std::uint64_t in_use_bytes,
                                     std::uint64_t requested_bytes)
    : std::runtime_error(fmt::format(
          "pinned host pool: allocating {} bytes would exceed the host budget of {} bytes ({} "
          "bytes in use)",
          requested_bytes, budget_bytes, in_use_bytes)),
      budget_bytes_(budget_bytes),
      requested_bytes_(requested_bytes) {}

// ---- PinnedBuffer ---------------------------------------------------------------------------

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PinnedBuffer::reset() noexcept {
  if (pool_ != nullptr) {
    pool_->release(data_, bytes_);
  }
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

// ---- PinnedLease ----------------------------------------------------------------------------

PinnedLease::PinnedLease(PinnedLease&& other) noexcept
    : state_(std::exchange(other.state_, nullptr)),
      index_(std::exchange(other.index_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

PinnedLease& PinnedLease::operator=(PinnedLease&& other) noexcept {
  if (this != &other) {
    reset();
    state_ = std::exchange(other.state_, nullptr);
    index_ = std::exchange(other.index_, 0);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PinnedLease::reset() noexcept {
  if (state_ != nullptr) {
    if (state_->poison) {
      std::memset(data_, kPoisonByte, bytes_);
    }
    {
      std::lock_guard lock(state_->mutex);
      STRATA_ASSERT(state_->free_indices.size() < state_->buffer_count, "lease returned twice");
      state_->free_indices.push_back(index_);
    }
    state_->returned.notify_one();
  }
  state_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

// ---- PinnedSlab -----------------------------------------------------------------------------

PinnedSlab::PinnedSlab(std::unique_ptr<detail::SlabState> state) : state_(std::move(state)) {}
PinnedSlab::PinnedSlab(PinnedSlab&&) noexcept = default;
PinnedSlab& PinnedSlab::operator=(PinnedSlab&&) noexcept = default;

PinnedSlab::~PinnedSlab() {
  if (state_) {
    std::lock_guard lock(state_->mutex);
    STRATA_ASSERT(state_->free_indices.size() == state_->buffer_count,
                  "a PinnedLease outlived its PinnedSlab");
  }
}

PinnedLease PinnedSlab::lease_front_locked() {
  const std::size_t index = state_->free_indices.back();
  state_->free_indices.pop_back();
  return PinnedLease(state_.get(), index, state_->backing.data() + index * state_->stride_bytes,
                     state_->buffer_bytes);
}

PinnedLease PinnedSlab::acquire() {
  std::unique_lock lock(state_->mutex);
  state_->returned.wait(lock, [&] { return !state_->free_indices.empty(); });
  return lease_front_locked();
}

std::optional<PinnedLease> PinnedSlab::try_acquire() {
  std::lock_guard lock(state_->mutex);
  if (state_->free_indices.empty()) {
    return std::nullopt;
  }
  return lease_front_locked();
}

std::size_t PinnedSlab::buffer_count() const {
  return state_->buffer_count;
}
std::uint64_t PinnedSlab::buffer_bytes() const {
  return state_->buffer_bytes;
}

std::size_t PinnedSlab::free_count() const {
  std::lock_guard lock(state_->mutex);
  return state_->free_indices.size();
}

// ---- PinnedPool -----------------------------------------------------------------------------

PinnedPool::PinnedPool(std::shared_ptr<PinnedAllocator> allocator, std::uint64_t budget_bytes,
                       PoisonOnRelease poison)
    : allocator_(std::move(allocator)),
      budget_bytes_(budget_bytes),
      poison_(poison_enabled(poison)) {
  STRATA_ASSERT(allocator_ != nullptr);
}

PinnedPool::~PinnedPool() {
  STRATA_ASSERT(live_buffers_ == 0, "a PinnedBuffer or PinnedSlab outlived its PinnedPool");
}

PinnedBuffer PinnedPool::allocate(std::uint64_t bytes) {
  if (bytes == 0) {
    return {};
  }
  const std::uint64_t accounted = round_up(bytes, kPinnedAlignment);
  {
    std::lock_guard lock(mutex_);
    if (accounted > budget_bytes_ - in_use_bytes_) {
      throw PinnedBudgetError(budget_bytes_, in_use_bytes_, bytes);
    }
    in_use_bytes_ += accounted;
    high_water_bytes_ = std::max(high_water_bytes_, in_use_bytes_);
    ++live_buffers_;
  }
  try {
    std::byte* data = allocator_->allocate(accounted);
    STRATA_ASSERT(is_aligned(reinterpret_cast<std::uintptr_t>(data), kPinnedAlignment));
    return PinnedBuffer(this, data, bytes);
  } catch (...) {
    std::lock_guard lock(mutex_);
    in_use_bytes_ -= accounted;
    --live_buffers_;
    throw;
  }
}

PinnedSlab PinnedPool::allocate_slab(std::size_t buffer_count, std::uint64_t buffer_bytes) {
  STRATA_ASSERT(buffer_count > 0 && buffer_bytes > 0);
  auto state = std::make_unique<detail::SlabState>();
  state->buffer_count = buffer_count;
  state->buffer_bytes = buffer_bytes;
  state->stride_bytes = round_up(buffer_bytes, kPinnedAlignment);  // every lease page-aligned
  state->poison = poison_;
  state->backing = allocate(state->stride_bytes * buffer_count);
  state->free_indices.reserve(buffer_count);
  for (std::size_t i = buffer_count; i > 0; --i) {
    state->free_indices.push_back(i - 1);  // lease buffer 0 first
  }
  return PinnedSlab(std::move(state));
}

void PinnedPool::release(std::byte* data, std::uint64_t bytes) noexcept {
  const std::uint64_t accounted = round_up(bytes, kPinnedAlignment);
  allocator_->free(data, accounted);
  std::lock_guard lock(mutex_);
  STRATA_ASSERT(in_use_bytes_ >= accounted && live_buffers_ > 0, "pinned budget underflow");
  in_use_bytes_ -= accounted;
  --live_buffers_;
}

std::uint64_t PinnedPool::in_use_bytes() const {
  std::lock_guard lock(mutex_);
  return in_use_bytes_;
}

std::uint64_t PinnedPool::high_water_bytes() const {
  std::lock_guard lock(mutex_);
  return high_water_bytes_;
}

}  // namespace strata::tiers
