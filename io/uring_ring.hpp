// UringRing: one io_uring instance (liburing io_uring_queue_init / io_uring_queue_exit), owned,
// neither copyable nor movable (the kernel maps its queues at fixed addresses it hands us).
#pragma once

#include <sys/uio.h>

#include <memory>
#include <span>

struct io_uring;

namespace strata::io {

class UringRing {
 public:
  // Throws UringUnavailable when the kernel refuses io_uring (ENOSYS, EPERM under seccomp or
  // kernel.io_uring_disabled), IoError for anything else.
  explicit UringRing(unsigned entries);
  UringRing(const UringRing&) = delete;
  UringRing& operator=(const UringRing&) = delete;
  ~UringRing();

  io_uring* get() const noexcept { return ring_.get(); }
  // Registers `buffers` as the ring's fixed buffers. Returns 0 or -errno (ENOMEM when
  // RLIMIT_MEMLOCK is too small): fixed buffers are an optimisation, so failure is the caller's
  // choice.
  int register_buffers(std::span<const iovec> buffers) const noexcept;

 private:
  std::unique_ptr<io_uring> ring_;
};

}  // namespace strata::io
