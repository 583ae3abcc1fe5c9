#include "io/ticket.hpp"

#include "base/assert.hpp"

namespace strata::io {

namespace detail {

void TicketState::complete_piece(std::uint64_t bytes, std::exception_ptr error) {
  bool last = false;
  {
    std::lock_guard lock(mutex_);
    STRATA_ASSERT(pending_pieces_ > 0, "a piece completed twice");
    bytes_ += bytes;
    if (error != nullptr && first_error_ == nullptr) {
      first_error_ = std::move(error);
    }
    last = --pending_pieces_ == 0;
  }
  if (last) {
    done_.notify_all();
  }
}

}  // namespace detail

bool Ticket::poll() const {
  STRATA_ASSERT(valid());
  std::lock_guard lock(state_->mutex_);
  return state_->pending_pieces_ == 0;
}

void Ticket::wait() const {
  STRATA_ASSERT(valid());
  std::unique_lock lock(state_->mutex_);
  state_->done_.wait(lock, [this] { return state_->pending_pieces_ == 0; });
}

bool Ticket::wait_for(std::chrono::nanoseconds timeout) const {
  STRATA_ASSERT(valid());
  std::unique_lock lock(state_->mutex_);
  return state_->done_.wait_for(lock, timeout, [this] { return state_->pending_pieces_ == 0; });
}

bool Ticket::ok() const {
  return error() == nullptr;
}

std::exception_ptr Ticket::error() const {
  wait();
  std::lock_guard lock(state_->mutex_);
  return state_->first_error_;
}

void Ticket::get() const {
  if (std::exception_ptr failure = error()) {
    std::rethrow_exception(failure);
  }
}

std::uint64_t Ticket::bytes_transferred() const {
  wait();
  std::lock_guard lock(state_->mutex_);
  return state_->bytes_;
}

}  // namespace strata::io
