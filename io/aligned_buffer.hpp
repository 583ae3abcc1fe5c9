// AlignedBuffer: one heap allocation aligned for O_DIRECT (4 KiB by default), owned and move-only.
#pragma once

#include <cstddef>
#include <span>

#include "base/units.hpp"

namespace strata::io {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates size_bytes rounded up to `alignment` (a power of two from 64 to 2 MiB), zero-filled
  // and faulted in. From 2 MiB up the memory is huge-page backed (io/huge_page_memory.hpp).
  // Throws std::bad_alloc when the memory is not there.
  static AlignedBuffer allocate(std::size_t size_bytes, std::size_t alignment = kDirectIoAlignment);

  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_bytes_; }
  std::span<std::byte> span() const noexcept { return {data_, size_bytes_}; }
  bool empty() const noexcept { return size_bytes_ == 0; }

 private:
  AlignedBuffer(std::byte* data, std::size_t size_bytes) : data_(data), size_bytes_(size_bytes) {}

  std::byte* data_ = nullptr;
  std::size_t size_bytes_ = 0;
};

}  // namespace strata::io
