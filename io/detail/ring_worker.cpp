#include "io/detail/ring_worker.hpp"

#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "base/assert.hpp"
#include "io/io_error.hpp"

namespace strata::io::detail {

namespace {

// user_data of the eventfd read and of the shutdown cancel; I/O slots use their index, always
// smaller.
constexpr std::uint64_t kWakeupTag = ~std::uint64_t{0};
constexpr std::uint64_t kCancelTag = ~std::uint64_t{0} - 1;

}  // namespace

RingWorker::RingWorker(std::uint32_t queue_depth, std::size_t queued_pieces,
                       FaultInjector* faults, std::span<const iovec> fixed_buffers)
    // One SQE more than queue_depth: the eventfd read is always armed next to the I/O.
    : ring_(queue_depth + 1),
      faults_(faults),
      queue_(queued_pieces),
      slots_(queue_depth) {
  event_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (event_fd_ < 0) {
    throw IoError("eventfd", "", 0, 0, errno);
  }
  if (!fixed_buffers.empty()) {
    fixed_registration_ = ring_.register_buffers(fixed_buffers);
  }
  free_slots_.reserve(queue_depth);
  for (std::uint32_t slot = queue_depth; slot > 0; --slot) {
    free_slots_.push_back(slot - 1);
  }
  thread_ = std::thread([this] { run(); });
}

RingWorker::~RingWorker() {
  stopping_.store(true);
  queue_.close();
  wake();
  thread_.join();
  ::close(event_fd_);
}

void RingWorker::push(Piece& piece) {
  if (!queue_.push(piece)) {
    cancel_piece(piece);
    return;
  }
  // Pairs with run(): it sets sleeping_ and then re-checks the queue; we pushed and then check
  // sleeping_. Either it sees the piece or we see it asleep and wake it.
  if (sleeping_.exchange(false)) {
    wake();
  }
}

void RingWorker::wake() const {
  const std::uint64_t one = 1;
  // Cannot fail short of a closed fd: the counter saturates at 2^64-2 wakes.
  [[maybe_unused]] const ssize_t written = ::write(event_fd_, &one, sizeof one);
}

void RingWorker::arm_wakeup() {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  STRATA_ASSERT(sqe != nullptr);
  io_uring_prep_read(sqe, event_fd_, &event_value_, sizeof event_value_, 0);
  io_uring_sqe_set_data64(sqe, kWakeupTag);
  wakeup_armed_ = true;
}

void RingWorker::prepare(std::uint32_t slot) {
  const Piece& piece = slots_[slot];
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  // The ring has queue_depth + 1 entries and at most that many operations exist at once.
  STRATA_ASSERT(sqe != nullptr);
  const int fd = piece.file->fd();
  const bool fixed = piece.fixed_buffer_index != kNotFixed && fixed_registration_ == 0;
  switch (piece.op) {
    case IoOp::kRead:
      if (fixed) {
        io_uring_prep_read_fixed(sqe, fd, piece.next_data(), piece.remaining_bytes(),
                                 piece.next_offset(), static_cast<int>(piece.fixed_buffer_index));
      } else {
        io_uring_prep_read(sqe, fd, piece.next_data(), piece.remaining_bytes(),
                           piece.next_offset());
      }
      break;
    case IoOp::kWrite:
      if (fixed) {
        io_uring_prep_write_fixed(sqe, fd, piece.next_data(), piece.remaining_bytes(),
                                  piece.next_offset(), static_cast<int>(piece.fixed_buffer_index));
      } else {
        io_uring_prep_write(sqe, fd, piece.next_data(), piece.remaining_bytes(),
                            piece.next_offset());
      }
      break;
    case IoOp::kFsync:
      io_uring_prep_fsync(sqe, fd, 0);
      break;
  }
  io_uring_sqe_set_data64(sqe, slot);
}

void RingWorker::cancel_in_flight() {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  if (sqe == nullptr) {
    io_uring_submit(ring_.get());
    sqe = io_uring_get_sqe(ring_.get());
  }
  STRATA_ASSERT(sqe != nullptr);
  // Operations that can still be cancelled (a poll-driven read of a pipe or socket, an op queued
  // for an io-wq worker) complete with -ECANCELED; disk I/O already at the device finishes
  // normally. A kernel older than 5.19 answers -EINVAL, and we simply wait for everything.
  io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
  io_uring_sqe_set_data64(sqe, kCancelTag);
  cancel_pending_ = true;
}

void RingWorker::complete(std::uint64_t user_data, std::int32_t result) {
  if (user_data == kCancelTag) {
    cancel_pending_ = false;
    return;
  }
  if (user_data == kWakeupTag) {
    wakeup_armed_ = false;
    if (!stopping_.load()) {
      arm_wakeup();
    }
    return;
  }
  const auto slot = static_cast<std::uint32_t>(user_data);
  Piece& piece = slots_[slot];
  if (finish_operation(piece, result, faults_) == PieceStep::kResubmit) {
    if (!stopping_.load()) {
      prepare(slot);
      return;
    }
    // Nothing new enters the kernel during shutdown: the remainder might never complete (a FIFO).
    cancel_piece(piece);
  }
  piece = Piece{};  // drops the ticket reference now, not when the slot is reused
  free_slots_.push_back(slot);
}

void RingWorker::run() {
  io_uring* ring = ring_.get();
  arm_wakeup();
  for (;;) {
    const bool stopping = stopping_.load();
    if (stopping) {
      for (Piece& piece : queue_.drain()) {
        cancel_piece(piece);
      }
      const bool idle = free_slots_.size() == slots_.size();
      if (!idle && !cancel_requested_) {
        cancel_in_flight();
        cancel_requested_ = true;
      }
      // Pieces in the kernel point into caller buffers: wait for every one, for the wakeup read
      // whose buffer is ours, and for the cancel.
      if (idle && !wakeup_armed_ && !cancel_pending_) {
        return;
      }
    } else {
      while (!free_slots_.empty()) {
        std::optional<Piece> piece = queue_.try_pop();
        if (!piece) {
          break;
        }
        const std::uint32_t slot = free_slots_.back();
        free_slots_.pop_back();
        slots_[slot] = std::move(*piece);
        prepare(slot);
      }
      if (!free_slots_.empty()) {
        sleeping_.store(true);
        if (!queue_.empty()) {
          sleeping_.store(false);
          continue;
        }
      }
    }
    const int submitted = io_uring_submit_and_wait(ring, 1);
    sleeping_.store(false);
    STRATA_ASSERT(
        submitted >= 0 || submitted == -EINTR || submitted == -EAGAIN || submitted == -EBUSY,
        "io_uring_submit_and_wait failed");
    unsigned seen = 0;
    unsigned head = 0;
    io_uring_cqe* cqe = nullptr;
    io_uring_for_each_cqe(ring, head, cqe) {
      complete(io_uring_cqe_get_data64(cqe), cqe->res);
      ++seen;
    }
    io_uring_cq_advance(ring, seen);
  }
}

}  // namespace strata::io::detail
