// IoEngineOptions: what an engine is built with; fixed for its lifetime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/units.hpp"
#include "io/file_handle.hpp"

namespace strata::io {

class FaultInjector;

enum class IoEngineKind : std::uint8_t {
  kAuto,     // io_uring, or POSIX with one warning line when the kernel refuses io_uring
  kIoUring,  // io_uring or a clear error
  kPosix,    // a thread pool over pread/pwrite
};

std::string_view to_string(IoEngineKind kind);
// "auto", "io_uring" or "posix"; anything else is nullopt.
std::optional<IoEngineKind> parse_io_engine_kind(std::string_view text);

struct IoEngineOptions {
  IoEngineKind kind = IoEngineKind::kAuto;
  // Requests are split into pieces of at most this many bytes (a multiple of 4 KiB, <= 1 GiB).
  std::uint64_t block_size_bytes = kMiB;
  // Pieces in flight per ring (io_uring) or per ring's worth of threads (POSIX).
  std::uint32_t queue_depth = 16;
  // io_uring rings, each owned by one I/O thread. POSIX runs queue_depth * rings threads (<= 64).
  std::uint32_t rings = 1;
  // Pieces that may wait in the hand-off queue of each ring (io_uring) or of the thread pool
  // (POSIX) beyond those in flight; submit() blocks only when it is full. 0: 2 * queue_depth.
  // A caller whose buffers bound what it can have submitted (the runtime's staging) sizes it to
  // that bound, so its submitting thread never blocks (queued_pieces_for()).
  std::uint32_t queued_pieces = 0;
  // How IoEngine::open_file opens files. kOff: buffered I/O; durability needs IoEngine::sync().
  DirectIo direct = DirectIo::kOn;
  // Registered with every io_uring ring as fixed buffers when the kernel allows; a request names
  // one by its position here (IoRequest::fixed_buffer_index). Any memory works: a BufferPool's
  // buffers() or the caller's own pinned host buffers. It must outlive the engine.
  std::vector<std::span<std::byte>> fixed_buffers;
  // Tests only: consulted at every completed operation; must outlive the engine.
  FaultInjector* faults = nullptr;
};

// The capacity of each io_uring ring's hand-off queue: options.queued_pieces, its default resolved.
std::size_t queued_pieces_per_queue(const IoEngineOptions& options);

// Pieces that at most `requests` requests covering `bytes` of buffers in all can be cut into, at
// block_size pieces and stripes: a request's ragged start and end add at most two.
std::uint64_t pieces_for(std::uint64_t bytes, std::uint64_t requests,
                         std::uint64_t block_size_bytes);

}  // namespace strata::io
