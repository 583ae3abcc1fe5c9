// Kernel timing for the CUDA benches (strata-attention-bench, strata-kernel-bench): two CUDA
// events around a launch sequence on the default stream, warm-up runs first, the median of the
// timed runs (robust to a stray slow run). CUDA failures throw std::runtime_error naming the call.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "models/decoder/cuda_device_array.hpp"

namespace strata::examples {

class EventTimer {
 public:
  EventTimer() {
    llm::cuda::check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    llm::cuda::check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  // The median milliseconds of `iterations` runs after `warmup` untimed ones.
  double median_ms(const std::function<void()>& launch, int warmup, int iterations) {
    for (int i = 0; i < warmup; ++i) launch();
    llm::cuda::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<double> times;
    for (int i = 0; i < iterations; ++i) {
      llm::cuda::check_cuda(cudaEventRecord(start_, nullptr), "cudaEventRecord");
      launch();
      llm::cuda::check_cuda(cudaEventRecord(stop_, nullptr), "cudaEventRecord");
      llm::cuda::check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      float ms = 0;
      llm::cuda::check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
      times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace strata::examples
