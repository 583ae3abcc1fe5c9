// HostDevice streams and events: one worker thread per stream, condition variables everywhere a
// thread waits. Lock order: a stream's mutex, then an event's mutex (the worker never holds its
// own mutex while waiting on an event).
#include "tiers/device/host_device.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <variant>

#include "base/assert.hpp"
#include "tiers/device/host_kernels.hpp"
#include "tiers/device/host_optimizer.hpp"
#include "tiers/device/pinned_allocator.hpp"

namespace strata::tiers {

namespace {

struct HostEventState {
  std::mutex mutex;
  std::condition_variable completed_changed;
  std::uint64_t recorded_generation = 0;   // bumped by each record()
  std::uint64_t completed_generation = 0;  // highest generation whose marker was reached
  std::exception_ptr error;                // the recording stream's error at that marker
};

class HostEvent final : public detail::EventImpl {
 public:
  void wait() override {
    std::unique_lock lock(state_->mutex);
    const std::uint64_t target = state_->recorded_generation;
    state_->completed_changed.wait(lock, [&] { return state_->completed_generation >= target; });
    if (state_->error) {
      std::rethrow_exception(state_->error);
    }
  }

  bool is_complete() override {
    std::lock_guard lock(state_->mutex);
    return state_->completed_generation >= state_->recorded_generation;
  }

  const std::shared_ptr<HostEventState>& state() const { return state_; }

 private:
  std::shared_ptr<HostEventState> state_ = std::make_shared<HostEventState>();
};

struct RecordMarker {
  std::shared_ptr<HostEventState> event;
  std::uint64_t generation;
};

struct WaitMarker {
  std::shared_ptr<HostEventState> event;
  std::uint64_t generation;
};

using Entry = std::variant<DeviceOp, RecordMarker, WaitMarker>;

HostEvent& host_event(detail::EventImpl& event) {
  auto* host = dynamic_cast<HostEvent*>(&event);
  STRATA_ASSERT(host != nullptr, "an Event of another device was used on a HostDevice stream");
  return *host;
}

// Runs a DeviceOp on the worker: the plain loops, or cpu_adam in the device's arena.
struct HostRunner {
  tbb::task_arena& arena;
  template <typename Op>
  void operator()(const Op& op) const {
    detail::run_on_host(op);
  }
  void operator()(const OptimizerOp& op) const { detail::run_on_host(op, arena); }
  void operator()(const SumOfSquaresOp& op) const { detail::run_on_host(op, arena); }
};

class HostStream final : public detail::StreamImpl {
 public:
  HostStream(std::size_t queue_depth, tbb::task_arena& arena)
      : queue_depth_(queue_depth), arena_(arena) {
    STRATA_ASSERT(queue_depth_ > 0);
    worker_ = std::thread([this] { run(); });
  }

  ~HostStream() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_available_.notify_one();
    worker_.join();
    detail::report_uncollected_error("HostDevice", error_);
  }

  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  void submit(DeviceOp op) override { push(Entry{std::move(op)}); }

  void record(detail::EventImpl& event) override {
    const auto& state = host_event(event).state();
    // The generation is taken only once the marker has its place in the queue (under the stream
    // lock), so a waiter can never capture a generation whose marker is still waiting for space.
    push_with([&state]() -> Entry {
      std::lock_guard lock(state->mutex);
      return RecordMarker{state, ++state->recorded_generation};
    });
  }

  void wait(detail::EventImpl& event) override {
    const auto& state = host_event(event).state();
    std::uint64_t generation = 0;
    {
      std::lock_guard lock(state->mutex);
      generation = state->recorded_generation;
    }
    if (generation != 0) {  // an event never recorded is complete
      push(WaitMarker{state, generation});
    }
  }

  void synchronize() override {
    std::unique_lock lock(mutex_);
    became_idle_.wait(lock, [&] { return completed_ == submitted_; });
    if (error_) {
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }

 private:
  void push(Entry entry) {
    push_with([&entry] { return std::move(entry); });
  }

  // Waits for space, then makes the entry and queues it under the stream lock.
  template <typename MakeEntry>
  void push_with(MakeEntry make_entry) {
    {
      std::unique_lock lock(mutex_);
      STRATA_ASSERT(!stopping_);
      space_available_.wait(lock, [&] { return queue_.size() < queue_depth_; });
      queue_.push_back(make_entry());
      ++submitted_;
    }
    work_available_.notify_one();
  }

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_available_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;  // stopping, and everything enqueued has run
      }
      Entry entry = std::move(queue_.front());
      queue_.pop_front();
      const std::exception_ptr error_before = error_;
      lock.unlock();
      space_available_.notify_one();

      std::exception_ptr new_error = execute(entry, error_before, arena_);

      lock.lock();
      if (new_error && !error_) {
        error_ = new_error;
      }
      ++completed_;
      if (completed_ == submitted_) {
        became_idle_.notify_all();
      }
    }
  }

  // Runs one entry without holding the stream mutex. Returns the error it raised, if any.
  static std::exception_ptr execute(Entry& entry, const std::exception_ptr& error_before,
                                    tbb::task_arena& arena) {
    if (auto* op = std::get_if<DeviceOp>(&entry)) {
      try {
        std::visit(HostRunner{arena}, *op);
      } catch (...) {
        return std::current_exception();
      }
      return nullptr;
    }
    if (auto* marker = std::get_if<RecordMarker>(&entry)) {
      {
        std::lock_guard lock(marker->event->mutex);
        if (marker->generation >= marker->event->completed_generation) {
          marker->event->completed_generation = marker->generation;
          marker->event->error = error_before;
        }
      }
      marker->event->completed_changed.notify_all();
      return nullptr;
    }
    auto& marker = std::get<WaitMarker>(entry);
    std::unique_lock lock(marker.event->mutex);
    marker.event->completed_changed.wait(
        lock, [&] { return marker.event->completed_generation >= marker.generation; });
    return nullptr;
  }

  const std::size_t queue_depth_;
  tbb::task_arena& arena_;  // the device's; it outlives every stream

  std::mutex mutex_;  // guards everything below
  std::condition_variable work_available_;
  std::condition_variable space_available_;
  std::condition_variable became_idle_;
  std::deque<Entry> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after every member above exists
};

}  // namespace

HostDevice::HostDevice(const DeviceOptions& options)
    : Device(DeviceKind::kHost, options, "host"),
      pinned_allocator_(std::make_shared<MmapPinnedAllocator>()),
      arena_(options.host_compute_threads > 0 ? options.host_compute_threads
                                              : tbb::task_arena::automatic) {}

HostDevice::~HostDevice() {
  release_quarantine();
}

Stream HostDevice::create_stream() {
  return Stream(*this, std::make_unique<HostStream>(options().stream_queue_depth, arena_));
}

Event HostDevice::create_event() {
  return Event(*this, std::make_unique<HostEvent>());
}

std::shared_ptr<PinnedAllocator> HostDevice::pinned_allocator() {
  return pinned_allocator_;
}

std::byte* HostDevice::allocate_raw(std::uint64_t bytes) {
  return static_cast<std::byte*>(::operator new (bytes, std::align_val_t{kBufferAlignment}));
}

void HostDevice::free_raw(std::byte* data, std::uint64_t /*bytes*/) noexcept {
  ::operator delete (data, std::align_val_t{kBufferAlignment});
}

void HostDevice::poison_raw(std::byte* data, std::uint64_t bytes) noexcept {
  std::memset(data, kPoisonByte, bytes);
}

}  // namespace strata::tiers
