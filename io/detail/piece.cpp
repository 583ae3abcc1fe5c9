#include "io/detail/piece.hpp"

#include <cerrno>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "io/detail/power_loss_hook.hpp"
#include "io/fault_injector.hpp"
#include "io/io_error.hpp"

namespace strata::io::detail {

namespace {

// A device that keeps answering EAGAIN this often is broken, not busy.
constexpr std::uint32_t kMaxRetries = 10'000;

void fail(Piece& piece, int error_number, std::string_view hint = {}) {
  const std::string operation(to_string(piece.op));
  piece.ticket->complete_piece(
      piece.done_bytes,
      std::make_exception_ptr(IoError(operation, piece.file->path(), piece.next_offset(),
                                      piece.remaining_bytes(), error_number, hint)));
}

void report_to_power_loss(const Piece& piece, std::int64_t result) {
  if (piece.op == IoOp::kWrite && result > 0) {
    report_write(piece.file->path(), piece.next_offset(),
                 {piece.next_data(), static_cast<std::size_t>(result)});
  } else if (piece.op == IoOp::kFsync && result == 0) {
    report_fsync(piece.file->path());
  }
}

}  // namespace

PieceStep finish_operation(Piece& piece, std::int64_t result, FaultInjector* faults) {
  // What reached the file system, before any injected fault reinterprets it.
  if (active_power_loss() != nullptr) report_to_power_loss(piece, result);
  if (faults != nullptr) {
    const std::size_t alignment = piece.file->direct() ? kDirectIoAlignment : 1;
    result = faults->on_complete(piece.op, piece.file->path(), piece.next_offset(),
                                 {piece.next_data(), piece.remaining_bytes()}, alignment, result);
  }
  if (result == -EAGAIN || result == -EINTR) {
    if (++piece.retries <= kMaxRetries) {
      return PieceStep::kResubmit;
    }
    fail(piece, static_cast<int>(-result), "still refused after 10000 retries");
    return PieceStep::kFinished;
  }
  if (result < 0) {
    fail(piece, static_cast<int>(-result));
    return PieceStep::kFinished;
  }
  if (piece.op == IoOp::kFsync) {
    piece.ticket->complete_piece(0, nullptr);
    return PieceStep::kFinished;
  }
  if (result == 0 && piece.remaining_bytes() > 0) {
    // A read past the end of the file (or a write the device took nothing of): never success.
    fail(piece, piece.op == IoOp::kRead ? ENODATA : EIO,
         piece.op == IoOp::kRead ? "end of file before the range ends" : "wrote no bytes");
    return PieceStep::kFinished;
  }
  STRATA_ASSERT(static_cast<std::uint64_t>(result) <= piece.remaining_bytes());
  piece.done_bytes += static_cast<std::uint32_t>(result);
  if (piece.done_bytes < piece.length_bytes) {
    return PieceStep::kResubmit;
  }
  piece.ticket->complete_piece(piece.done_bytes, nullptr);
  return PieceStep::kFinished;
}

void cancel_piece(Piece& piece) {
  fail(piece, ECANCELED, "the engine shut down before this request ran");
}

}  // namespace strata::io::detail
