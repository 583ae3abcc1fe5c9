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
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

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
  std::string model_;
  // Destroyed in reverse: the buffers first (after the destructor's synchronize), then cuBLAS,
  // then the stream.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> owned_stream_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, BlasDeleter> owned_blas_;
  std::vector<tiers::DeviceBuffer> buffers_;
  std::size_t allocated_bytes_ = 0;
};

}  // namespace strata::examples
