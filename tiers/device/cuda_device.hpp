// CudaDevice: the Device on an NVIDIA GPU. Memory is cudaMalloc'ed within the budget, a Stream is a
// non-blocking cudaStream_t, an Event a cudaEvent_t (blocking sync: waiting hosts sleep, they do
// not spin), copies are cudaMemcpyAsync and the kernels live in cuda_kernels.cu. Built only when
// STRATA_HAVE_CUDA; this header stays free of CUDA headers so tiers/ users need none.
//
// Every CUDA call is checked; a failure throws CudaError naming the call, the device index and
// cudaGetErrorString. Host callbacks run through cudaLaunchHostFunc; an exception they throw is
// kept and rethrown by the stream's next synchronize(), as on HostDevice.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "tiers/device/device.hpp"

namespace strata::tiers {

class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& call, int device_index, int error_code,
            const std::string& error_text);
  int device_index() const { return device_index_; }
  int error_code() const { return error_code_; }

 private:
  int device_index_;
  int error_code_;
};

class CudaDevice final : public Device {
 public:
  // Throws CudaError when the index is not a usable GPU.
  explicit CudaDevice(const DeviceOptions& options);
  ~CudaDevice() override;

  Stream create_stream() override;
  Event create_event() override;
  std::shared_ptr<PinnedAllocator> pinned_allocator() override;

 protected:
  std::byte* allocate_raw(std::uint64_t bytes) override;
  void free_raw(std::byte* data, std::uint64_t bytes) noexcept override;
  void poison_raw(std::byte* data, std::uint64_t bytes) noexcept override;

 private:
  std::shared_ptr<PinnedAllocator> pinned_allocator_;
};

namespace detail {
std::string cuda_unavailable_reason();
int cuda_device_count();
}

}  // namespace strata::tiers
