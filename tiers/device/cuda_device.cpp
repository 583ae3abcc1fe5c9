// CudaDevice: runtime-API calls, checked one by one. Host-callback errors travel through an
// ErrorSlot shared by the stream, its callbacks and the events recorded on it.
#include "tiers/device/cuda_device.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <mutex>
#include <variant>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "io/huge_page_memory.hpp"
#include "tiers/device/cuda_kernels.hpp"
#include "tiers/device/cuda_optimizer.hpp"
#include "tiers/device/pinned_allocator.hpp"

namespace strata::tiers {

CudaError::CudaError(const std::string& call, int device_index, int error_code,
                     const std::string& error_text)
    : std::runtime_error(fmt::format("{} failed on CUDA device {}: {} (error {})", call,
                                     device_index, error_text, error_code)),
      device_index_(device_index),
      error_code_(error_code) {}

namespace {

void check(cudaError_t result, const char* call, int device_index) {
  if (result != cudaSuccess) {
    throw CudaError(call, device_index, static_cast<int>(result), cudaGetErrorString(result));
  }
}

// For destructors and other noexcept paths: report, never throw.
void report(cudaError_t result, const char* call, int device_index) noexcept {
  if (result != cudaSuccess) {
    std::fprintf(stderr, "strata: %s failed on CUDA device %d: %s\n", call, device_index,
                 cudaGetErrorString(result));
  }
}

void set_device(int device_index) {
  check(cudaSetDevice(device_index), "cudaSetDevice", device_index);
}

// Errors raised by host callbacks of one stream. `sequence` numbers callbacks in enqueue order.
struct ErrorSlot {
  std::mutex mutex;
  std::exception_ptr error;          // pending until synchronize() reports it
  std::uint64_t error_sequence = 0;  // the callback that raised it
};

struct CallbackPayload {
  std::function<void()> function;
  std::shared_ptr<ErrorSlot> slot;
  std::uint64_t sequence;
};

void CUDART_CB run_host_callback(void* user_data) {
  std::unique_ptr<CallbackPayload> payload(static_cast<CallbackPayload*>(user_data));
  try {
    payload->function();
  } catch (...) {
    std::lock_guard lock(payload->slot->mutex);
    if (!payload->slot->error) {
      payload->slot->error = std::current_exception();
      payload->slot->error_sequence = payload->sequence;
    }
  }
}

class CudaEvent final : public detail::EventImpl {
 public:
  explicit CudaEvent(int device_index) : device_index_(device_index) {
    set_device(device_index_);
    // Blocking sync: a host waiting on this event sleeps instead of spinning a core.
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming | cudaEventBlockingSync),
          "cudaEventCreateWithFlags", device_index_);
  }
  ~CudaEvent() override { report(cudaEventDestroy(event_), "cudaEventDestroy", device_index_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void wait() override {
    check(cudaEventSynchronize(event_), "cudaEventSynchronize", device_index_);
    if (producer_) {
      std::lock_guard lock(producer_->mutex);
      if (producer_->error && producer_->error_sequence < recorded_sequence_) {
        std::rethrow_exception(producer_->error);
      }
    }
  }

  bool is_complete() override {
    const cudaError_t result = cudaEventQuery(event_);
    if (result == cudaErrorNotReady) {
      return false;
    }
    check(result, "cudaEventQuery", device_index_);
    return true;
  }

  cudaEvent_t handle() const { return event_; }
  void set_producer(std::shared_ptr<ErrorSlot> slot, std::uint64_t sequence) {
    producer_ = std::move(slot);
    recorded_sequence_ = sequence;
  }

 private:
  int device_index_;
  cudaEvent_t event_ = nullptr;
  std::shared_ptr<ErrorSlot> producer_;
  std::uint64_t recorded_sequence_ = 0;
};

CudaEvent& cuda_event(detail::EventImpl& event) {
  auto* cuda = dynamic_cast<CudaEvent*>(&event);
  STRATA_ASSERT(cuda != nullptr, "an Event of another device was used on a CUDA stream");
  return *cuda;
}

class CudaStream final : public detail::StreamImpl {
 public:
  explicit CudaStream(int device_index) : device_index_(device_index) {
    set_device(device_index_);
    // Non-blocking: no implicit ordering with the legacy default stream.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
          device_index_);
  }

  ~CudaStream() override {
    report(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", device_index_);  // drain
    report(cudaStreamDestroy(stream_), "cudaStreamDestroy", device_index_);
    std::lock_guard lock(slot_->mutex);
    detail::report_uncollected_error("CUDA", slot_->error);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void submit(DeviceOp op) override {
    set_device(device_index_);
    std::visit([this](auto& concrete) { enqueue(concrete); }, op);
  }

  void record(detail::EventImpl& event) override {
    auto& cuda = cuda_event(event);
    check(cudaEventRecord(cuda.handle(), stream_), "cudaEventRecord", device_index_);
    cuda.set_producer(slot_, next_sequence_);
  }

  void wait(detail::EventImpl& event) override {
    check(cudaStreamWaitEvent(stream_, cuda_event(event).handle(), 0), "cudaStreamWaitEvent",
          device_index_);
  }

  void synchronize() override {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", device_index_);
    std::exception_ptr error;
    {
      std::lock_guard lock(slot_->mutex);
      error = std::exchange(slot_->error, nullptr);
    }
    if (error) {
      std::rethrow_exception(error);
    }
  }

 private:
  void enqueue(const CopyOp& op) {
    if (op.bytes == 0) {
      return;
    }
    const cudaMemcpyKind kind =
        op.direction == CopyDirection::kHostToDevice   ? cudaMemcpyHostToDevice
        : op.direction == CopyDirection::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyDeviceToDevice;
    check(cudaMemcpyAsync(op.dst, op.src, op.bytes, kind, stream_), "cudaMemcpyAsync",
          device_index_);
  }
  void enqueue(const CastOp& op) {
    check(detail::launch_cast(op, stream_), "cast kernel launch", device_index_);
  }
  void enqueue(const ScaleOp& op) {
    check(detail::launch_scale(op, stream_), "scale kernel launch", device_index_);
  }
  void enqueue(const FillOp& op) {
    check(detail::launch_fill(op, stream_), "fill kernel launch", device_index_);
  }
  void enqueue(const FillBytesOp& op) {
    if (op.bytes != 0) {
      check(cudaMemsetAsync(op.data, op.value, op.bytes, stream_), "cudaMemsetAsync",
            device_index_);
    }
  }
  void enqueue(const AccumulateOp& op) {
    check(detail::launch_accumulate(op, stream_), "accumulate kernel launch", device_index_);
  }
  void enqueue(const OptimizerOp& op) {
    check(detail::launch_optimizer(op, stream_), "optimizer kernel launch", device_index_);
  }
  void enqueue(const SumOfSquaresOp& op) {
    check(detail::launch_sum_of_squares(op, stream_), "sum-of-squares kernel launch",
          device_index_);
  }
  void enqueue(HostCallbackOp& op) {
    auto payload = std::make_unique<CallbackPayload>(
        CallbackPayload{std::move(op.function), slot_, next_sequence_++});
    check(cudaLaunchHostFunc(stream_, run_host_callback, payload.get()), "cudaLaunchHostFunc",
          device_index_);
    payload.release();  // owned by the callback from now on
  }

  int device_index_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<ErrorSlot> slot_ = std::make_shared<ErrorSlot>();
  std::uint64_t next_sequence_ = 0;
};

// Page-aligned host memory, mapped here and page-locked by cudaHostRegister. cudaHostAlloc
// promises no alignment beyond what its sub-allocator picks, and a small request came back
// 4 KiB-misaligned on an H200, while the pool's leases are read and written with O_DIRECT.
// Mapping the memory ourselves makes kPinnedAlignment hold by construction, and the mapping is
// huge-page backed like the host device's.
class CudaHostAllocator final : public PinnedAllocator {
 public:
  explicit CudaHostAllocator(int device_index) : device_index_(device_index) {}

  std::byte* allocate(std::uint64_t bytes) override {
    const std::uint64_t length = round_up(bytes, kPinnedAlignment);
    std::byte* data = map_host_pages(bytes);
    set_device(device_index_);
    // Portable: pinned for every CUDA context, so several devices may copy from it.
    const cudaError_t result = cudaHostRegister(data, length, cudaHostRegisterPortable);
    if (result != cudaSuccess) {
      io::unmap_huge_page_backed(data, length);
      check(result, "cudaHostRegister", device_index_);
    }
    STRATA_ASSERT(reinterpret_cast<std::uintptr_t>(data) % kPinnedAlignment == 0);
    return data;
  }

  void free(std::byte* data, std::uint64_t bytes) noexcept override {
    report(cudaHostUnregister(data), "cudaHostUnregister", device_index_);
    io::unmap_huge_page_backed(data, round_up(bytes, kPinnedAlignment));
  }

  std::string_view name() const override { return "cudaHostRegister"; }

 private:
  int device_index_;
};

std::string device_name(int device_index) {
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device_index), "cudaGetDeviceProperties",
        device_index);
  return fmt::format("cuda:{} ({})", device_index, properties.name);
}

}  // namespace

namespace detail {

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t result = cudaGetDeviceCount(&count);
  if (result != cudaSuccess) {
    return fmt::format("cudaGetDeviceCount failed: {}", cudaGetErrorString(result));
  }
  if (count == 0) {
    return "cudaGetDeviceCount found no CUDA device";
  }
  return {};
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

}  // namespace detail

CudaDevice::CudaDevice(const DeviceOptions& options)
    : Device(DeviceKind::kCuda, options, device_name(options.index)),
      pinned_allocator_(std::make_shared<CudaHostAllocator>(options.index)) {}

CudaDevice::~CudaDevice() {
  release_quarantine();
}

Stream CudaDevice::create_stream() {
  return Stream(*this, std::make_unique<CudaStream>(options().index));
}

Event CudaDevice::create_event() {
  return Event(*this, std::make_unique<CudaEvent>(options().index));
}

std::shared_ptr<PinnedAllocator> CudaDevice::pinned_allocator() {
  return pinned_allocator_;
}

std::byte* CudaDevice::allocate_raw(std::uint64_t bytes) {
  set_device(options().index);
  void* data = nullptr;
  check(cudaMalloc(&data, bytes), "cudaMalloc", options().index);
  return static_cast<std::byte*>(data);
}

void CudaDevice::free_raw(std::byte* data, std::uint64_t /*bytes*/) noexcept {
  report(cudaSetDevice(options().index), "cudaSetDevice", options().index);
  report(cudaFree(data), "cudaFree", options().index);
}

void CudaDevice::poison_raw(std::byte* data, std::uint64_t bytes) noexcept {
  // Debug knob only: a synchronous fill so the pattern is in place before anyone can look.
  report(cudaSetDevice(options().index), "cudaSetDevice", options().index);
  report(cudaMemset(data, kPoisonByte, bytes), "cudaMemset", options().index);
  report(cudaDeviceSynchronize(), "cudaDeviceSynchronize", options().index);
}

}  // namespace strata::tiers
