#include "io/aligned_buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "base/assert.hpp"

namespace strata::io {

AlignedBuffer AlignedBuffer::allocate(std::size_t size_bytes, std::size_t alignment) {
  STRATA_ASSERT(alignment >= kSimdAlignment && (alignment & (alignment - 1)) == 0,
                "alignment must be a power of two of at least 64");
  const std::size_t rounded = round_up(size_bytes == 0 ? 1 : size_bytes, alignment);
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory == nullptr) {
    throw std::bad_alloc();
  }
  // Zero-filled so that a buffer read back before it was written never shows stale heap bytes.
  std::memset(memory, 0, rounded);
  return AlignedBuffer(static_cast<std::byte*>(memory), rounded);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

}  // namespace strata::io
