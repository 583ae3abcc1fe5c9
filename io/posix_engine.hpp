// PosixEngine: the IoEngine interface over a thread pool doing pread/pwrite/fsync. The fallback
// where io_uring is refused, and the second backend every engine test runs on.
#pragma once

#include <thread>
#include <vector>

#include "io/detail/bounded_queue.hpp"
#include "io/detail/piece.hpp"
#include "io/engine.hpp"

namespace strata::io {

class PosixEngine final : public IoEngine {
 public:
  // Starts min(queue_depth * rings, 64) threads; each runs one piece at a time.
  explicit PosixEngine(const IoEngineOptions& options);
  ~PosixEngine() override;

  std::string_view name() const override { return "posix"; }

 private:
  void enqueue(detail::Piece& piece) override;
  void run();

  detail::BoundedQueue<detail::Piece> queue_;
  std::vector<std::thread> threads_;
};

}  // namespace strata::io
