// RingWorker: one io_uring ring and the one thread that owns it (see uring_engine.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "io/detail/bounded_queue.hpp"
#include "io/detail/piece.hpp"
#include "io/uring_ring.hpp"

namespace strata::io::detail {

class RingWorker {
 public:
  // fixed_buffers: registered with the ring when not empty; registered() says whether it worked.
  // queued_pieces: capacity of the hand-off queue (pieces waiting beyond the queue_depth in
  // flight).
  RingWorker(std::uint32_t queue_depth, std::size_t queued_pieces, FaultInjector* faults,
             std::span<const iovec> fixed_buffers);
  RingWorker(const RingWorker&) = delete;
  RingWorker& operator=(const RingWorker&) = delete;
  // Completes queued pieces with ECANCELED, asks the kernel to cancel the pieces in flight (those
  // it can cancel complete with ECANCELED, the others finish), waits for all, joins the thread.
  ~RingWorker();

  int fixed_buffer_registration() const noexcept { return fixed_registration_; }
  // Any thread. Blocks while the queue is full.
  void push(Piece& piece);

 private:
  void run();
  void wake() const;
  void arm_wakeup();
  void prepare(std::uint32_t slot);
  void complete(std::uint64_t user_data, std::int32_t result);
  void cancel_in_flight();

  UringRing ring_;
  int event_fd_ = -1;
  std::uint64_t event_value_ = 0;  // the kernel writes the eventfd counter here
  bool wakeup_armed_ = false;
  bool cancel_requested_ = false;  // at shutdown, once
  bool cancel_pending_ = false;
  int fixed_registration_ = -1;  // 0: fixed buffers registered; -errno otherwise
  FaultInjector* faults_;
  BoundedQueue<Piece> queue_;
  std::vector<Piece> slots_;  // one per piece in flight, queue_depth of them
  std::vector<std::uint32_t> free_slots_;
  std::atomic<bool> sleeping_{false};  // the thread may be blocked in io_uring_enter
  std::atomic<bool> stopping_{false};
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace strata::io::detail
