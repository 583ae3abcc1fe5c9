#include "io/uring_ring.hpp"

#include <liburing.h>

#include <cerrno>

#include "io/uring_unavailable.hpp"

namespace strata::io {

UringRing::UringRing(unsigned entries) : ring_(std::make_unique<io_uring>()) {
  const int result = io_uring_queue_init(entries, ring_.get(), 0);
  if (result < 0) {
    ring_.reset();
    if (result == -ENOSYS || result == -EPERM || result == -EACCES) {
      throw UringUnavailable(-result);
    }
    throw IoError("io_uring_queue_init", "", 0, 0, -result);
  }
}

UringRing::~UringRing() {
  if (ring_) {
    io_uring_queue_exit(ring_.get());
  }
}

int UringRing::register_buffers(std::span<const iovec> buffers) const noexcept {
  return io_uring_register_buffers(ring_.get(), buffers.data(),
                                   static_cast<unsigned>(buffers.size()));
}

}  // namespace strata::io
