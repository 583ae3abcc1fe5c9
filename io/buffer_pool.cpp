#include "io/buffer_pool.hpp"

#include <algorithm>
#include <utility>

#include "base/assert.hpp"
#include "base/debug_knobs.hpp"

namespace strata::io {

namespace {

constexpr std::byte kPoison{0xDE};

}  // namespace

BufferPool::BufferPool(std::size_t buffer_count, std::size_t buffer_bytes)
    : buffer_count_(buffer_count),
      buffer_bytes_(round_up(buffer_bytes, kDirectIoAlignment)),
      poison_on_release_(poison_io_buffers_knob()),
      memory_(AlignedBuffer::allocate(buffer_count_ * buffer_bytes_)) {
  STRATA_ASSERT(buffer_count > 0 && buffer_bytes > 0);
  free_.reserve(buffer_count_);
  // Pushed in reverse so that the first acquire() gets buffer 0 (predictable in tests).
  for (std::size_t i = buffer_count_; i > 0; --i) {
    free_.push_back(static_cast<std::uint32_t>(i - 1));
  }
}

BufferPool::~BufferPool() {
  STRATA_ASSERT(free_.size() == buffer_count_, "a BufferPool lease outlived its pool");
}

BufferPool::Lease BufferPool::acquire() {
  std::unique_lock lock(mutex_);
  released_.wait(lock, [this] { return !free_.empty(); });
  const std::uint32_t index = free_.back();
  free_.pop_back();
  return Lease(this, index);
}

std::optional<BufferPool::Lease> BufferPool::try_acquire() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) {
    return std::nullopt;
  }
  const std::uint32_t index = free_.back();
  free_.pop_back();
  return Lease(this, index);
}

std::size_t BufferPool::free_count() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

std::span<std::byte> BufferPool::buffer(std::uint32_t index) const noexcept {
  STRATA_ASSERT(index < buffer_count_);
  return memory_.span().subspan(std::size_t{index} * buffer_bytes_, buffer_bytes_);
}

std::vector<std::span<std::byte>> BufferPool::buffers() const {
  std::vector<std::span<std::byte>> all;
  all.reserve(buffer_count_);
  for (std::uint32_t i = 0; i < buffer_count_; ++i) {
    all.push_back(buffer(i));
  }
  return all;
}

void BufferPool::release(std::uint32_t index) noexcept {
  if (poison_on_release_) {
    const std::span<std::byte> bytes = buffer(index);
    std::fill(bytes.begin(), bytes.end(), kPoison);
  }
  {
    std::lock_guard lock(mutex_);
    STRATA_ASSERT(free_.size() < buffer_count_, "buffer released twice");
    free_.push_back(index);
  }
  released_.notify_one();
}

BufferPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), index_(other.index_) {}

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) {
      pool_->release(index_);
    }
    pool_ = std::exchange(other.pool_, nullptr);
    index_ = other.index_;
  }
  return *this;
}

BufferPool::Lease::~Lease() {
  if (pool_ != nullptr) {
    pool_->release(index_);
  }
}

}  // namespace strata::io
