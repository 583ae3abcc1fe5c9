// HostDevice: a Device whose memory is a budgeted host arena and whose streams are worker threads.
// It gives real asynchrony and real budgets, so every scheduling path of the runtime (prefetch,
// overlap, eviction) runs on machines without a GPU; it is also a plain CPU training backend.
//
// - Memory: each DeviceBuffer is its own 4 KiB-aligned host allocation, counted against the budget.
// - Stream: one worker thread running a bounded FIFO (DeviceOptions::stream_queue_depth entries;
//   enqueue blocks while it is full). No busy-waiting: workers and waiters sleep on condition
//   variables.
// - Event: a generation counter. record() enqueues a marker; the event completes when the worker
//   reaches it. Stream::wait(event) enqueues an entry that makes the worker sleep until then.
// - Optimizer and norm ops: cpu_adam's kernels (host_optimizer.hpp), run from the stream's worker
//   in the device's own task arena (DeviceOptions::host_compute_threads threads).
// - Errors: the first exception thrown by enqueued work becomes the stream's error, rethrown by the
//   next synchronize(); later work still runs (as on CUDA after a failed host callback), so
//   callbacks that signal completion are never lost and no waiter hangs.
// - Destruction: a stream drains its queue before its thread exits; an error nobody collected is
//   printed on stderr rather than silently lost.
#pragma once

#include <memory>

#include <oneapi/tbb/task_arena.h>

#include "tiers/device/device.hpp"

namespace strata::tiers {

class HostDevice final : public Device {
 public:
  explicit HostDevice(const DeviceOptions& options);
  ~HostDevice() override;

  Stream create_stream() override;
  Event create_event() override;
  std::shared_ptr<PinnedAllocator> pinned_allocator() override;

  static constexpr std::size_t kBufferAlignment = 4096;

 protected:
  std::byte* allocate_raw(std::uint64_t bytes) override;
  void free_raw(std::byte* data, std::uint64_t bytes) noexcept override;
  void poison_raw(std::byte* data, std::uint64_t bytes) noexcept override;

 private:
  std::shared_ptr<PinnedAllocator> pinned_allocator_;
  tbb::task_arena arena_;  // the optimizer and norm ops' threads, shared by every stream
};

}  // namespace strata::tiers
