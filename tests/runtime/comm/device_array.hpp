// A test helper for the NcclComm tests: a cudaMalloc'd array with upload/download, checked by
// GoogleTest assertions. CUDA builds only.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <vector>

namespace strata::runtime::comm::testing {

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&data_, count * sizeof(T) + 1), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  std::span<T> span() { return {static_cast<T*>(data_), count_}; }
  void upload(const std::vector<T>& values) {
    ASSERT_EQ(cudaMemcpy(data_, values.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> download() {
    std::vector<T> values(count_);
    EXPECT_EQ(cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return values;
  }

 private:
  void* data_ = nullptr;
  std::size_t count_;
};

}  // namespace strata::runtime::comm::testing
