// Device: the small interface through which the runtime uses an accelerator (or the host pretending
// to be one). Memory within a byte budget, streams that run work in order, events that order work
// across streams and let the host wait, and the few kernels the runtime needs.
//
// Units: every size is bytes (`*_bytes`) unless it is named `count` (elements).
// Alignment: every DeviceBuffer starts on a kDeviceAlignment boundary (HostDevice: 4 KiB). The
//   budget counts round_up(request, kDeviceAllocationGranularity) per buffer.
// Pool: a released buffer's memory is kept in a free list keyed by its accounted size and handed
//   to the next request of that size, so steady-state steps (the same gathers and evictions every
//   step) call the backend's allocator (cudaMalloc, which synchronises the device) only in the
//   first step. Pooled bytes count against the budget together with the bytes in use: a request
//   that would not fit frees pooled blocks (largest first) before it is refused, so in_use_bytes()
//   + pooled_bytes() <= budget_bytes() always. backend_allocation_count() counts the backend calls.
// Ownership: Device outlives every DeviceBuffer, Stream and Event it created (checked when the
//   device is destroyed). Host memory passed to a copy must stay valid, and device memory must not
//   be released, until the work using it has completed (wait on an event or synchronize); for real
//   asynchrony on CUDA the host side should be pinned (Device::pinned_allocator()): a copy from
//   device to pageable host memory makes CUDA block the calling thread until the copy is done.
// Threading: Device members are thread-safe. A Stream may be fed from any thread (enqueueing is
//   internally locked) but it has one owner in practice: work from two threads interleaves in an
//   unspecified order. Event::wait/is_complete may be called from any thread; record it from the
//   thread that feeds the recording stream.
// Errors: a failure inside enqueued work (a throwing host callback, a CUDA fault) is kept by the
//   stream and rethrown by its next synchronize() (once), and by Event::wait() on an event recorded
//   after the failure. Later work still runs (a callback that signals completion or returns a
//   lease is never lost), except after a CUDA fault, which stops the whole CUDA context; the first
//   error is the one reported. Misuse (size mismatch, unaligned span) trips STRATA_ASSERT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tiers/device/device_kind.hpp"
#include "tiers/device/device_op.hpp"
#include "base/dtype.hpp"
#include "tiers/device/poison.hpp"

namespace strata::tiers {

class Device;
class Event;
class PinnedAllocator;

inline constexpr std::size_t kDeviceAlignment = 256;
inline constexpr std::uint64_t kDeviceAllocationGranularity = 256;

struct DeviceOptions {
  DeviceKind kind = DeviceKind::kAuto;
  int index = 0;  // CUDA device ordinal; ignored by HostDevice
  std::uint64_t budget_bytes = 1ull << 30;
  std::size_t stream_queue_depth = 1024;  // HostDevice: ops queued per stream before enqueue blocks
  // Poison on release (tiers/device/poison.hpp): released buffers are filled with kPoisonByte and
  // held in a FIFO quarantine of at most poison_quarantine_bytes before their memory is freed, so
  // a stale read is defined and shows NaNs.
  PoisonOnRelease poison = PoisonOnRelease::kFromEnvironment;
  std::uint64_t poison_quarantine_bytes = 64ull << 20;
  // HostDevice: threads its optimizer and norm ops spread over (0: one per core). Ignored by CUDA.
  int host_compute_threads = 0;
};

// Allocation past the budget. Names the device, the budget, the bytes in use and the request.
class DeviceBudgetError : public std::runtime_error {
 public:
  DeviceBudgetError(const std::string& device_name, std::uint64_t budget_bytes,
                    std::uint64_t in_use_bytes, std::uint64_t requested_bytes);
  std::uint64_t budget_bytes() const { return budget_bytes_; }
  std::uint64_t in_use_bytes() const { return in_use_bytes_; }
  std::uint64_t requested_bytes() const { return requested_bytes_; }

 private:
  std::uint64_t budget_bytes_;
  std::uint64_t in_use_bytes_;
  std::uint64_t requested_bytes_;
};

// A non-owning view of device memory: address and length in bytes.
struct DeviceSpan {
  std::byte* data = nullptr;
  std::uint64_t bytes = 0;

  DeviceSpan subspan(std::uint64_t offset_bytes, std::uint64_t length_bytes) const;
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data);
  }
};

// Device memory, move-only; returns its bytes to the device's budget when destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  std::byte* data() const { return data_; }
  std::uint64_t bytes() const { return bytes_; }
  DeviceSpan span() const { return {data_, bytes_}; }
  DeviceSpan span(std::uint64_t offset_bytes, std::uint64_t length_bytes) const {
    return span().subspan(offset_bytes, length_bytes);
  }
  explicit operator bool() const { return device_ != nullptr; }
  void reset() noexcept;  // releases now (the same as destruction)

 private:
  friend class Device;
  DeviceBuffer(Device* device, std::byte* data, std::uint64_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}
  Device* device_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

namespace detail {

class EventImpl {
 public:
  virtual ~EventImpl() = default;
  virtual void wait() = 0;  // blocks (no spinning) until the recorded work is done
  virtual bool is_complete() = 0;
};

class StreamImpl {
 public:
  virtual ~StreamImpl() = default;  // drains the queued work, then releases the stream
  virtual void submit(DeviceOp op) = 0;
  virtual void record(EventImpl& event) = 0;
  virtual void wait(EventImpl& event) = 0;
  virtual void synchronize() = 0;
};

// For a StreamImpl's destructor: an error no synchronize() collected is printed on stderr rather
// than lost, naming the kind of stream ("CUDA", "HostDevice"). Nothing is printed without one.
void report_uncollected_error(const char* stream_kind, const std::exception_ptr& error) noexcept;

}  // namespace detail

// A completion marker. record() on a stream captures the work enqueued so far; wait() blocks the
// host until that work is done. An event never recorded is complete. Move-only.
class Event {
 public:
  Event(Device& device, std::unique_ptr<detail::EventImpl> impl);
  Event(Event&&) noexcept = default;
  Event& operator=(Event&& other) noexcept;
  ~Event() { reset(); }

  void wait() { impl_->wait(); }
  bool is_complete() { return impl_->is_complete(); }
  detail::EventImpl& impl() { return *impl_; }

 private:
  void reset() noexcept;
  Device* device_;
  std::unique_ptr<detail::EventImpl> impl_;
};

// An in-order queue of work on a device. Everything below returns once the work is enqueued.
// Destroying a stream runs its queued work to completion first (never cancels half-way).
class Stream {
 public:
  Stream(Device& device, std::unique_ptr<detail::StreamImpl> impl);
  Stream(Stream&&) noexcept = default;
  Stream& operator=(Stream&& other) noexcept;
  ~Stream() { reset(); }

  void copy_to_device(DeviceSpan dst, const void* host_src);  // dst.bytes bytes
  void copy_to_host(void* host_dst, DeviceSpan src);          // src.bytes bytes
  void copy_on_device(DeviceSpan dst, DeviceSpan src);        // equal lengths
  // dst and src hold the same element count in their types; see CastOp for the pairs.
  void cast(DeviceSpan dst, DType dst_type, DeviceSpan src, DType src_type);
  void scale(DeviceSpan data_fp32, float factor);
  void fill(DeviceSpan data_fp32, float value);
  void fill_bytes(DeviceSpan data, std::uint8_t value);
  void accumulate(DeviceSpan dst_fp32, DeviceSpan src, DType src_type);
  // One optimizer update of a sub-group in device memory (OptimizerOp; checked here).
  void optimizer_update(const OptimizerOp& op);
  // *sum_fp64 += the sum of squares of src's elements (SumOfSquaresOp): the bits of
  // cpu_adam::sum_of_squares. scratch: at least sum_of_squares_scratch_bytes(count) bytes.
  void sum_of_squares(DeviceSpan src, DType src_type, DeviceSpan sum_fp64, DeviceSpan scratch);
  void host_callback(std::function<void()> function);
  void submit(DeviceOp op);  // any op, unchecked beyond what the backend asserts

  void record(Event& event);
  void wait(Event& event);  // later work on this stream starts after the event's work is done
  void synchronize();       // blocks the host until all enqueued work is done; rethrows its error

 private:
  void reset() noexcept;  // drains the queued work, then releases the stream
  Device* device_;
  std::unique_ptr<detail::StreamImpl> impl_;
};

class Device {
 public:
  Device(DeviceKind kind, DeviceOptions options, std::string name);
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Throws DeviceBudgetError past the budget. A zero-byte request gives an empty buffer.
  DeviceBuffer allocate(std::uint64_t bytes);
  virtual Stream create_stream() = 0;
  virtual Event create_event() = 0;
  // Host memory the device copies from/to fastest (mmap + cudaHostRegister on CUDA, locked pages on host).
  virtual std::shared_ptr<PinnedAllocator> pinned_allocator() = 0;

  DeviceKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  const DeviceOptions& options() const { return options_; }
  bool poisons_on_release() const { return poison_; }
  std::uint64_t budget_bytes() const { return options_.budget_bytes; }
  std::uint64_t in_use_bytes() const;
  std::uint64_t high_water_bytes() const;
  std::uint64_t live_buffer_count() const;
  // Memory held in the pool (released, not yet returned to the backend).
  std::uint64_t pooled_bytes() const;
  // allocate_raw / free_raw calls so far: flat across steps once the pool is warm.
  std::uint64_t backend_allocation_count() const;
  std::uint64_t backend_free_count() const;
  // Returns every pooled block to the backend (e.g. before handing the memory to another library).
  void release_pool() noexcept;

 protected:
  virtual std::byte* allocate_raw(std::uint64_t bytes) = 0;
  virtual void free_raw(std::byte* data, std::uint64_t bytes) noexcept = 0;
  virtual void poison_raw(std::byte* data, std::uint64_t bytes) noexcept = 0;
  // Derived destructors call this first: it frees the quarantine and the pool through free_raw,
  // which is no longer callable once the derived part is gone.
  void release_quarantine() noexcept;

 private:
  friend class DeviceBuffer;
  friend class Stream;
  friend class Event;
  void release(std::byte* data, std::uint64_t bytes) noexcept;
  std::byte* take_pooled_locked(std::uint64_t accounted);
  void make_room_locked(std::uint64_t accounted,
                        std::vector<std::pair<std::byte*, std::uint64_t>>& to_free);
  void free_blocks(const std::vector<std::pair<std::byte*, std::uint64_t>>& blocks) noexcept;

  DeviceOptions options_;
  std::string name_;
  DeviceKind kind_;
  bool poison_ = false;
  mutable std::mutex mutex_;  // guards the counters and the quarantine
  std::uint64_t in_use_bytes_ = 0;
  std::uint64_t high_water_bytes_ = 0;
  std::uint64_t live_buffers_ = 0;
  std::uint64_t live_streams_ = 0;
  std::uint64_t live_events_ = 0;
  std::deque<std::pair<std::byte*, std::uint64_t>> quarantine_;
  std::uint64_t quarantine_bytes_ = 0;
  std::multimap<std::uint64_t, std::byte*> pool_;  // accounted bytes -> free block
  std::uint64_t pooled_bytes_ = 0;
  std::uint64_t backend_allocations_ = 0;
  std::uint64_t backend_frees_ = 0;
};

// Device scratch a SumOfSquaresOp over `count` elements needs (one double per norm block).
std::uint64_t sum_of_squares_scratch_bytes(std::uint64_t count);

// HostDevice for kHost, CudaDevice for kCuda (throws if not built with CUDA or no GPU), and for
// kAuto: CUDA when built with it and a GPU is present, else HostDevice.
std::unique_ptr<Device> make_device(const DeviceOptions& options);

// Why CUDA cannot be used here (not built with CUDA, cudaGetDeviceCount failed or found none), or
// an empty string when it can.
std::string cuda_unavailable_reason();

// CUDA devices this process can see: 0 without CUDA, when cudaGetDeviceCount fails or finds none.
int cuda_device_count();

}  // namespace strata::tiers
