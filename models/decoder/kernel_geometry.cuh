// How the decoder's element-wise and row-wise kernels are laid out on the GPU, shared by
// decoder_cuda_kernels.cu and fused_kernels.cu: 256-thread blocks, grid-stride loops over elements
// (at most kMaxBlocks blocks), one warp per row, and the warp's butterfly sum (a fixed order, so
// the same bits every run).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace strata::llm::cuda::detail {

inline constexpr unsigned kThreads = 256;
inline constexpr unsigned kWarp = 32;
inline constexpr unsigned kWarpsPerBlock = kThreads / kWarp;
inline constexpr std::size_t kMaxBlocks = 4096;  // grid-stride beyond

inline unsigned elementwise_blocks(std::size_t count) {
  const std::size_t needed = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, kMaxBlocks)));
}
inline unsigned row_blocks(std::size_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

__device__ inline std::size_t global_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}
__device__ inline unsigned lane_id() { return threadIdx.x % kWarp; }
__device__ inline unsigned warp_id() { return threadIdx.x / kWarp; }
__device__ inline std::size_t warp_row() {
  return static_cast<std::size_t>(blockIdx.x) * kWarpsPerBlock + warp_id();
}

// Butterflies over the 32 lanes: every lane ends with the same value, combined in a fixed order.
__device__ inline float warp_sum(float value) {
  for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

}  // namespace strata::llm::cuda::detail
