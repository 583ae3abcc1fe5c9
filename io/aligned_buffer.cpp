#include "io/aligned_buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "base/assert.hpp"
#include "io/huge_page_memory.hpp"

namespace strata::io {

namespace {

// Buffers this large are mapped on huge pages (huge_page_memory.hpp: fewer, larger device
// requests); smaller ones come from the heap. The size alone says which, so the destructor knows.
bool huge_page_backed(std::size_t size_bytes) {
  return size_bytes >= kHugePageBytes;
}

void release(std::byte* data, std::size_t size_bytes) noexcept {
  if (data == nullptr) return;
  if (huge_page_backed(size_bytes)) {
    unmap_huge_page_backed(data, size_bytes);
  } else {
    std::free(data);
  }
}

}  // namespace

AlignedBuffer AlignedBuffer::allocate(std::size_t size_bytes, std::size_t alignment) {
  STRATA_ASSERT(alignment >= kSimdAlignment && alignment <= kHugePageBytes &&
                    (alignment & (alignment - 1)) == 0,
                "alignment must be a power of two from 64 to 2 MiB");
  const std::size_t rounded = round_up(size_bytes == 0 ? 1 : size_bytes, alignment);
  if (huge_page_backed(rounded)) {
    std::byte* data = map_huge_page_backed(rounded);  // zeroed by the kernel
    populate(data, rounded);
    return AlignedBuffer(data, rounded);
  }
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
    release(data_, size_bytes_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  release(data_, size_bytes_);
}

}  // namespace strata::io
