// UringEngine: the IoEngine interface over io_uring. `rings` rings, each owned by one I/O thread
// that alone submits to and reaps from it; submitting threads hand pieces over through a bounded
// queue per ring (round-robin) and wake the thread through an eventfd the ring itself reads, so an
// idle thread sleeps in io_uring_enter and never spins.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "io/engine.hpp"

namespace strata::io {

namespace detail {
class RingWorker;
}

class UringEngine final : public IoEngine {
 public:
  // Throws UringUnavailable when the kernel refuses io_uring, IoError for other setup failures.
  // Registers options.fixed_buffers with every ring; when the kernel refuses (RLIMIT_MEMLOCK),
  // prints one warning line and runs without fixed buffers.
  explicit UringEngine(const IoEngineOptions& options);
  ~UringEngine() override;

  std::string_view name() const override { return "io_uring"; }
  bool fixed_buffers_registered() const noexcept { return fixed_buffers_registered_; }

 private:
  void enqueue(detail::Piece& piece) override;

  std::vector<std::unique_ptr<detail::RingWorker>> workers_;
  std::atomic<std::uint32_t> next_ring_{0};
  bool fixed_buffers_registered_ = false;
};

}  // namespace strata::io
