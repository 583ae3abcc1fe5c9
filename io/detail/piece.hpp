// Piece: the unit an engine hands to the kernel, at most block_size bytes of one request, and the
// rule both engines share for what an operation's result means (retry, resubmit the rest, finish).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "io/file_handle.hpp"
#include "io/io_request.hpp"
#include "io/ticket.hpp"

namespace strata::io {
class FaultInjector;
}

namespace strata::io::detail {

inline constexpr std::uint32_t kNotFixed = std::numeric_limits<std::uint32_t>::max();

struct Piece {
  std::shared_ptr<TicketState> ticket;
  const FileHandle* file = nullptr;
  std::byte* data = nullptr;
  std::uint64_t offset_bytes = 0;
  std::uint32_t length_bytes = 0;
  std::uint32_t done_bytes = 0;  // moved so far (short transfers advance it)
  std::uint32_t fixed_buffer_index = kNotFixed;
  std::uint32_t retries = 0;  // EAGAIN/EINTR seen so far
  IoOp op = IoOp::kRead;

  // The part still to transfer.
  std::byte* next_data() const { return data + done_bytes; }
  std::uint64_t next_offset() const { return offset_bytes + done_bytes; }
  std::uint32_t remaining_bytes() const { return length_bytes - done_bytes; }
};

enum class PieceStep : std::uint8_t { kResubmit, kFinished };

// Acts on one operation's `result` (bytes moved, or -errno) after consulting `faults` (may be
// null): EAGAIN/EINTR -> kResubmit (bounded); a short transfer -> advance and kResubmit; a read at
// end of file -> failed; any other error -> failed. On kFinished the piece's ticket has been
// completed (with an IoError naming op, path, offset, length and errno text on failure).
PieceStep finish_operation(Piece& piece, std::int64_t result, FaultInjector* faults);

// Completes a piece that never ran (the engine shut down first) with ECANCELED.
void cancel_piece(Piece& piece);

}  // namespace strata::io::detail
