#include "io/posix_engine.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace strata::io {

namespace {

constexpr std::uint32_t kMaxThreads = 64;

std::uint32_t thread_count_for(const IoEngineOptions& options) {
  return std::clamp(options.queue_depth * options.rings, 1U, kMaxThreads);
}

std::int64_t run_operation(const detail::Piece& piece) {
  const int fd = piece.file->fd();
  ssize_t result = 0;
  switch (piece.op) {
    case IoOp::kRead:
      result = ::pread(fd, piece.next_data(), piece.remaining_bytes(),
                       static_cast<off_t>(piece.next_offset()));
      break;
    case IoOp::kWrite:
      result = ::pwrite(fd, piece.next_data(), piece.remaining_bytes(),
                        static_cast<off_t>(piece.next_offset()));
      break;
    case IoOp::kFsync:
      result = ::fsync(fd);
      break;
  }
  return result < 0 ? -errno : result;
}

}  // namespace

PosixEngine::PosixEngine(const IoEngineOptions& options)
    : IoEngine(options), queue_(options.queued_pieces > 0 ? std::size_t{options.queued_pieces}
                                                          : 2 * std::size_t{thread_count_for(options)}) {
  const std::uint32_t count = thread_count_for(options);
  threads_.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    threads_.emplace_back([this] { run(); });
  }
}

PosixEngine::~PosixEngine() {
  queue_.close();
  for (std::thread& thread : threads_) {
    thread.join();
  }
  for (detail::Piece& piece : queue_.drain()) {
    detail::cancel_piece(piece);
  }
}

void PosixEngine::enqueue(detail::Piece& piece) {
  if (!queue_.push(piece)) {
    detail::cancel_piece(piece);
  }
}

void PosixEngine::run() {
  while (std::optional<detail::Piece> piece = queue_.pop()) {
    while (detail::finish_operation(*piece, run_operation(*piece), options().faults) ==
           detail::PieceStep::kResubmit) {
    }
  }
}

}  // namespace strata::io
