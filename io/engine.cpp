#include "io/engine.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "base/assert.hpp"
#include "io/detail/piece.hpp"

namespace strata::io {

std::string_view to_string(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kAuto:
      return "auto";
    case IoEngineKind::kIoUring:
      return "io_uring";
    case IoEngineKind::kPosix:
      return "posix";
  }
  return "?";
}

std::optional<IoEngineKind> parse_io_engine_kind(std::string_view text) {
  if (text == "auto") {
    return IoEngineKind::kAuto;
  }
  if (text == "io_uring") {
    return IoEngineKind::kIoUring;
  }
  if (text == "posix") {
    return IoEngineKind::kPosix;
  }
  return std::nullopt;
}

std::size_t queued_pieces_per_queue(const IoEngineOptions& options) {
  return options.queued_pieces > 0 ? options.queued_pieces : 2 * std::size_t{options.queue_depth};
}

std::uint64_t pieces_for(std::uint64_t bytes, std::uint64_t requests,
                         std::uint64_t block_size_bytes) {
  return (bytes + block_size_bytes - 1) / block_size_bytes + 2 * requests;
}

IoEngine::IoEngine(const IoEngineOptions& options) : options_(options) {
  STRATA_ASSERT(options.block_size_bytes > 0 && options.block_size_bytes <= kGiB &&
                    is_aligned(options.block_size_bytes, kDirectIoAlignment),
                "block_size must be a multiple of 4 KiB, at most 1 GiB");
  STRATA_ASSERT(options.queue_depth > 0 && options.rings > 0);
}

IoEngine::~IoEngine() = default;

FileId IoEngine::add_file(FileHandle file) {
  STRATA_ASSERT(file.valid());
  std::lock_guard lock(files_mutex_);
  files_.push_back(std::make_unique<FileHandle>(std::move(file)));
  return static_cast<FileId>(files_.size() - 1);
}

FileId IoEngine::open_file(const std::filesystem::path& path, std::uint64_t size_bytes,
                           CreateMode create) {
  FileHandle file = FileHandle::open(path, {create, options_.direct});
  file.allocate(size_bytes);
  return add_file(std::move(file));
}

const FileHandle& IoEngine::file(FileId id) const {
  std::lock_guard lock(files_mutex_);
  STRATA_ASSERT(id < files_.size(), "unknown file id");
  return *files_[id];
}

Ticket IoEngine::submit(const IoRequest& request) {
  return submit(std::span(&request, 1));
}

Ticket IoEngine::submit(std::span<const IoRequest> requests) {
  const std::uint64_t block = options_.block_size_bytes;
  std::uint64_t pieces = 0;
  // Validate the whole batch before any piece of it is queued.
  for (const IoRequest& request : requests) {
    pieces += request.op == IoOp::kFsync ? 1 : (request.buffer.size() + block - 1) / block;
    if (file(request.file).direct() && request.op != IoOp::kFsync) {
      STRATA_ASSERT(is_aligned(request.offset_bytes, kDirectIoAlignment) &&
                        is_aligned(request.buffer.size(), kDirectIoAlignment) &&
                        is_aligned(reinterpret_cast<std::uintptr_t>(request.buffer.data()),
                                   kDirectIoAlignment),
                    "O_DIRECT requests need 4 KiB aligned offset, length and buffer");
    }
    if (request.fixed_buffer_index && request.op != IoOp::kFsync) {
      STRATA_ASSERT(*request.fixed_buffer_index < options_.fixed_buffers.size(),
                    "fixed_buffer_index names no registered buffer");
      const std::span<std::byte> fixed = options_.fixed_buffers[*request.fixed_buffer_index];
      const auto begin = reinterpret_cast<std::uintptr_t>(request.buffer.data());
      const auto fixed_begin = reinterpret_cast<std::uintptr_t>(fixed.data());
      STRATA_ASSERT(
          begin >= fixed_begin && begin + request.buffer.size() <= fixed_begin + fixed.size(),
          "the request's buffer lies outside the fixed buffer it names");
    }
  }
  STRATA_ASSERT(pieces <= std::numeric_limits<std::uint32_t>::max());
  auto state = std::make_shared<detail::TicketState>(static_cast<std::uint32_t>(pieces));

  for (const IoRequest& request : requests) {
    const FileHandle* handle = &file(request.file);
    detail::Piece piece;
    piece.ticket = state;
    piece.file = handle;
    piece.op = request.op;
    piece.fixed_buffer_index = request.fixed_buffer_index.value_or(detail::kNotFixed);
    if (request.op == IoOp::kFsync) {
      enqueue(piece);
      continue;
    }
    for (std::uint64_t done = 0; done < request.buffer.size(); done += block) {
      piece.ticket = state;
      piece.data = request.buffer.data() + done;
      piece.offset_bytes = request.offset_bytes + done;
      piece.length_bytes =
          static_cast<std::uint32_t>(std::min(block, request.buffer.size() - done));
      enqueue(piece);
    }
  }
  return Ticket(std::move(state));
}

}  // namespace strata::io
