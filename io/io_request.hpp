// IoRequest: one read, write or fsync as a plain value. Engines split it into block_size pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace strata::io {

enum class IoOp : std::uint8_t { kRead, kWrite, kFsync };

constexpr std::string_view to_string(IoOp op) {
  switch (op) {
    case IoOp::kRead:
      return "read";
    case IoOp::kWrite:
      return "write";
    case IoOp::kFsync:
      return "fsync";
  }
  return "?";
}

// Index of a file in an engine's registry (IoEngine::add_file).
using FileId = std::uint32_t;

// The buffer is borrowed: it must stay alive and untouched until the request's ticket completes.
// On an O_DIRECT file, offset_bytes, buffer.size() and buffer.data() must be multiples of 4 KiB.
struct IoRequest {
  IoOp op = IoOp::kRead;
  FileId file = 0;
  std::uint64_t offset_bytes = 0;
  std::span<std::byte> buffer;
  // The index in IoEngineOptions::fixed_buffers of the registered buffer that contains `buffer` (a
  // BufferPool::Lease::index() when the pool's buffers() were registered); lets io_uring use
  // READ_FIXED / WRITE_FIXED. Ignored where buffers are not registered.
  std::optional<std::uint32_t> fixed_buffer_index;

  static IoRequest read(FileId file, std::uint64_t offset_bytes, std::span<std::byte> buffer,
                        std::optional<std::uint32_t> fixed_buffer_index = std::nullopt) {
    return {IoOp::kRead, file, offset_bytes, buffer, fixed_buffer_index};
  }
  // The engine never writes into a write request's buffer; the const_cast only lets one span
  // type carry both directions.
  static IoRequest write(FileId file, std::uint64_t offset_bytes, std::span<const std::byte> buffer,
                         std::optional<std::uint32_t> fixed_buffer_index = std::nullopt) {
    return {IoOp::kWrite, file, offset_bytes,
            std::span<std::byte>(const_cast<std::byte*>(buffer.data()), buffer.size()),
            fixed_buffer_index};
  }
  static IoRequest fsync(FileId file) { return {IoOp::kFsync, file, 0, {}, std::nullopt}; }
};

}  // namespace strata::io
