// What the CUDA backends of the models share (gpt_cuda.cpp, models/decoder/decoder_cuda.cpp): the
// device they run on, one non-blocking stream with a cuBLAS handle bound to it (atomics not
// allowed, default math: no TF32, so products are bitwise reproducible on one GPU), activation
// buffers allocated through the tiers::Device within its budget and counted, host -> device
// copies on the stream, and CUDA / cuBLAS failures thrown as tiers::CudaError naming the model and
// the call. A backend class derives from it privately. Only CUDA-side sources include this header.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "base/assert.hpp"
#include "tiers/device/compute_fence.hpp"
#include "tiers/device/cuda_device.hpp"
#include "tiers/device/device.hpp"

namespace strata::examples {

class CudaBackend {
 public:
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

 protected:
  // `model`: the name errors carry ("GPT model", "decoder").
  CudaBackend(tiers::Device& device, std::string model)
      : device_(device), device_index_(device.options().index), model_(std::move(model)) {
    set_device();
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    owned_stream_.reset(stream_);
    check_blas(cublasCreate(&blas_), "cublasCreate");
    owned_blas_.reset(blas_);
    check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    check_blas(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    check_blas(cublasSetAtomicsMode(blas_, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  }
  ~CudaBackend() {
    cudaStreamSynchronize(stream_);  // the buffers go back only once the stream's work is done
  }

  std::size_t allocated_bytes() const { return allocated_bytes_; }

  // [Note: asynchronous unit calls] (docs/design.md): from now on end_call() records the call's
  // end on the returned fence instead of waiting for the stream, so a call returns with its work
  // queued and the host prepares the next one (the Engine's gathers, the last unit's gradient)
  // while the GPU computes. The caller then waits through the fence before it releases what the
  // calls read or reads what they wrote. Idempotent; there is no way back.
  tiers::ComputeFence* make_calls_asynchronous() {
    if (!fence_) fence_ = std::make_unique<CallFence>(*this);
    return fence_.get();
  }
  // The end of a unit call: waits for the stream, or (asynchronous calls) records the end.
  void end_call() {
    if (fence_) {
      fence_->record();
    } else {
      finish();
    }
  }

  // `count` elements of device memory, held until the backend is destroyed.
  template <typename T>
  T* allocate(std::size_t count) {
    tiers::DeviceBuffer buffer = device_.allocate(std::max<std::size_t>(1, count) * sizeof(T));
    allocated_bytes_ += count * sizeof(T);
    T* data = buffer.span().as<T>();
    buffers_.push_back(std::move(buffer));
    return data;
  }

  template <typename T>
  void copy_in(T* device_dst, const T* host_src, std::size_t count) {
    if (count == 0) return;
    check(cudaMemcpyAsync(device_dst, host_src, count * sizeof(T), cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
  }

  void set_device() const { check(cudaSetDevice(device_index_), "cudaSetDevice"); }
  // Waits for the stream: the caller may then release parameters and read gradients.
  void finish() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void check(cudaError_t result, const char* call) const {
    if (result != cudaSuccess) {
      throw tiers::CudaError(model_ + ": " + call, device_index_, static_cast<int>(result),
                             cudaGetErrorString(result));
    }
  }
  void check_blas(cublasStatus_t status, const char* call) const {
    if (status != CUBLAS_STATUS_SUCCESS) {
      throw tiers::CudaError(model_ + ": " + call, device_index_, static_cast<int>(status),
                             cublasGetStatusString(status));
    }
  }

  tiers::Device& device_;
  int device_index_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;

 private:
  struct StreamDeleter {
    void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
  };
  struct BlasDeleter {
    void operator()(cublasHandle_t handle) const { cublasDestroy(handle); }
  };
  // Tickets over the unit calls' ends: call c's end is recorded in events_[c % kEvents], so a
  // ticket's event is its own or a later call's (whose end implies its own: one stream).
  class CallFence final : public tiers::ComputeFence {
   public:
    explicit CallFence(const CudaBackend& backend) : backend_(backend) {
      for (cudaEvent_t& event : events_) {
        backend_.check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync),
                       "cudaEventCreateWithFlags");
      }
    }
    ~CallFence() override {
      for (cudaEvent_t event : events_) {
        if (event != nullptr) cudaEventDestroy(event);
      }
    }
    CallFence(const CallFence&) = delete;
    CallFence& operator=(const CallFence&) = delete;

    void record() {
      backend_.check(cudaEventRecord(events_[recorded_ % kEvents], backend_.stream_),
                     "cudaEventRecord");
      ++recorded_;
    }
    std::uint64_t mark() override { return recorded_; }
    void wait(std::uint64_t ticket) override {
      if (ticket <= done_) return;
      STRATA_ASSERT(ticket <= recorded_, "a ticket for a call not made");
      backend_.check(cudaEventSynchronize(events_[(ticket - 1) % kEvents]),
                     "a unit call's work (asynchronous)");
      done_ = ticket;
    }

   private:
    static constexpr std::size_t kEvents = 64;
    const CudaBackend& backend_;
    std::array<cudaEvent_t, kEvents> events_{};
    std::uint64_t recorded_ = 0;  // calls whose end is recorded: the ticket of all of them
    std::uint64_t done_ = 0;      // tickets up to this one waited for
  };

  std::string model_;
  std::unique_ptr<CallFence> fence_;  // make_calls_asynchronous
  // Destroyed in reverse: the buffers first (after the destructor's synchronize), then cuBLAS,
  // then the stream.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> owned_stream_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, BlasDeleter> owned_blas_;
  std::vector<tiers::DeviceBuffer> buffers_;
  std::size_t allocated_bytes_ = 0;
};

}  // namespace strata::examples
