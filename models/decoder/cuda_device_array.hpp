// A cudaMalloc'd array of `count` elements for the programs and tests that drive the decoder's
// kernels directly (strata-attention-bench, the flash-attention and cuBLASLt tests): filled from
// or read back to a host vector, poisoned with 0xff bytes (NaN as floats, so an element a kernel
// leaves unwritten fails any comparison). CUDA failures throw std::runtime_error naming the call.
// Only CUDA-side sources include this header.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::llm::cuda {

inline void check_cuda(cudaError_t result, const char* call) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(result));
  }
}

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count) : count_(count) {
    check_cuda(cudaMalloc(&data_, std::max<std::size_t>(1, count) * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  void upload(const std::vector<T>& host) {
    check_cuda(cudaMemcpy(data_, host.data(), std::min(count_, host.size()) * sizeof(T),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy");
  }
  void poison() { check_cuda(cudaMemset(data_, 0xff, count_ * sizeof(T)), "cudaMemset"); }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    check_cuda(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
               "cudaMemcpy");
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_;
};

}  // namespace strata::llm::cuda
