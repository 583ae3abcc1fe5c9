#include "io/uring_engine.hpp"

#include <cstdio>
#include <cstring>

#include "io/detail/ring_worker.hpp"
#include "io/fault_injector.hpp"
#include "io/uring_unavailable.hpp"

namespace strata::io {

UringEngine::UringEngine(const IoEngineOptions& options) : IoEngine(options) {
  if (options.faults != nullptr) {
    if (std::optional<int> refused = options.faults->take_ring_setup_error()) {
      throw UringUnavailable(*refused);
    }
  }
  std::vector<iovec> fixed;
  fixed.reserve(options.fixed_buffers.size());
  for (const std::span<std::byte> buffer : options.fixed_buffers) {
    fixed.push_back({buffer.data(), buffer.size()});
  }
  workers_.reserve(options.rings);
  int registration = 0;
  for (std::uint32_t i = 0; i < options.rings; ++i) {
    workers_.push_back(
        std::make_unique<detail::RingWorker>(options.queue_depth, queued_pieces_per_queue(options),
                                             options.faults, fixed));
    if (workers_.back()->fixed_buffer_registration() != 0) {
      registration = workers_.back()->fixed_buffer_registration();
    }
  }
  fixed_buffers_registered_ = !fixed.empty() && registration == 0;
  if (!fixed.empty() && registration != 0) {
    std::fprintf(stderr,
                 "strata: warning: io_uring refused fixed buffers (%s); running without them "
                 "(raise RLIMIT_MEMLOCK to enable)\n",
                 std::strerror(-registration));
  }
}

UringEngine::~UringEngine() = default;

void UringEngine::enqueue(detail::Piece& piece) {
  const std::uint32_t ring = next_ring_.fetch_add(1, std::memory_order_relaxed) % workers_.size();
  workers_[ring]->push(piece);
}

}  // namespace strata::io
