// Ticket: the completion of one submitted request (or batch), shared between the caller and the
// engine's I/O threads. Copyable handle; any thread may wait on or poll it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

namespace strata::io {

namespace detail {
class TicketState;
}

class Ticket {
 public:
  Ticket() = default;  // an empty ticket: valid() is false, and nothing else may be called
  explicit Ticket(std::shared_ptr<detail::TicketState> state) : state_(std::move(state)) {}

  bool valid() const noexcept { return state_ != nullptr; }
  // True once every piece has completed (successfully or not). Never blocks.
  bool poll() const;
  // Blocks until every piece has completed. Never throws for an I/O failure.
  void wait() const;
  // Waits at most `timeout`; returns poll().
  bool wait_for(std::chrono::nanoseconds timeout) const;

  // The following wait first.
  bool ok() const;
  // The first failure among the pieces (an IoError), or null on success.
  std::exception_ptr error() const;
  // Rethrows error() if there is one.
  void get() const;
  // Bytes moved by the pieces that succeeded (for a successful ticket: the requested total).
  std::uint64_t bytes_transferred() const;

 private:
  std::shared_ptr<detail::TicketState> state_;
};

namespace detail {

// Completion state behind a Ticket. The engine creates it with the number of pieces; each I/O
// thread reports each finished piece exactly once.
class TicketState {
 public:
  explicit TicketState(std::uint32_t pieces) : pending_pieces_(pieces) {}

  // Called once per piece. `error` is null on success. The last call wakes the waiters.
  void complete_piece(std::uint64_t bytes, std::exception_ptr error);

 private:
  friend class strata::io::Ticket;
  mutable std::mutex mutex_;
  mutable std::condition_variable done_;
  std::uint32_t pending_pieces_;
  std::uint64_t bytes_ = 0;
  std::exception_ptr first_error_;
};

}  // namespace detail
}  // namespace strata::io
