// The gradient's sum of squares on the device, in the fixed shape of cpu_adam's norm
// (cpu_adam/norm_shape.hpp), so the bits are cpu_adam::sum_of_squares's and no atomics decide an
// order:
//  1. block_sums_kernel: one warp per block of kNormBlockElems elements; lane l adds the squares
//     of elements l, l + 32, l + 64, ... in order (the CPU's lane l: kNormLanes is the warp size),
//     in double, then the warp adds its lanes in the CPU's halving tree (shuffles down 16, 8, 4, 2,
//     1). x * x is exact in double for fp32, bf16 and fp16 x, so only the adds round, as there.
//  2. tree_kernel: the block sums in the CPU's binary tree. One thread block: thread t computes the
//     node t of depth `depth` (the first depth with up to 1024 nodes, all of whose ancestors are
//     inner nodes), recursively as the CPU does; thread 0 then adds those nodes up the top levels
//     and adds the total to *sum.
#include <cuda_runtime.h>

#include <cstdint>

#include "base/float16.hpp"
#include "cpu_adam/norm_shape.hpp"
#include "tiers/device/cuda_optimizer.hpp"

namespace strata::tiers::detail {
namespace {

using cpu_adam::kNormBlockElems;
using cpu_adam::kNormLanes;
using cpu_adam::kNormLeafBlocks;
static_assert(kNormLanes == 32, "a warp's lanes are the norm's lanes");

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 8;         // rows of 32 elements loaded before they are added
constexpr int kMaxTreeDepth = 10;  // 1024 threads compute the nodes of this depth
constexpr int kTreeThreads = 1 << kMaxTreeDepth;

__device__ __forceinline__ double value_of(const float* data, std::uint64_t i) {
  return static_cast<double>(data[i]);
}
__device__ __forceinline__ double value_of(const Bf16* data, std::uint64_t i) {
  return static_cast<double>(to_float(data[i]));
}
__device__ __forceinline__ double value_of(const Fp16* data, std::uint64_t i) {
  return static_cast<double>(to_float(data[i]));
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    block_sums_kernel(const T* data, std::uint64_t count, double* block_sums) {
  const std::uint64_t blocks = (count + kNormBlockElems - 1) / kNormBlockElems;
  const unsigned lane = threadIdx.x % 32;
  std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * kWarpsPerBlock;
  for (; b < blocks; b += stride) {  // b is the same across the warp: no divergence
    const std::uint64_t begin = b * kNormBlockElems;
    const std::uint64_t end = count - begin < kNormBlockElems ? count : begin + kNormBlockElems;
    double sum = 0.0;
    for (std::uint64_t row = begin; row < end; row += 32 * kUnroll) {
      double values[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::uint64_t i = row + 32 * u + lane;
        values[u] = i < end ? value_of(data, i) : 0.0;
      }
      // In element order; an element past the end adds nothing (the lane skips it on the CPU).
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (row + 32 * u + lane < end) sum = __dadd_rn(sum, __dmul_rn(values[u], values[u]));
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      sum = __dadd_rn(sum, __shfl_down_sync(0xFFFF'FFFFu, sum, offset));
    }
    if (lane == 0) block_sums[b] = sum;
  }
}

// grad_norm.cpp's NormJob::reduce over block sums [first, last).
__device__ double tree_sum(const double* sums, std::uint64_t first, std::uint64_t last) {
  if (last - first <= kNormLeafBlocks) {
    double sum = 0.0;
    for (std::uint64_t b = first; b < last; ++b) sum = __dadd_rn(sum, sums[b]);
    return sum;
  }
  const std::uint64_t middle = first + (last - first) / 2;
  return __dadd_rn(tree_sum(sums, first, middle), tree_sum(sums, middle, last));
}

// The same tree above `depth`, its nodes at `depth` taken from `nodes` (index: the path's bits,
// low half 0, most significant first).
__device__ double top_sum(const double* nodes, std::uint64_t first, std::uint64_t last, int level,
                          int depth, unsigned index) {
  if (level == depth) return nodes[index];
  const std::uint64_t middle = first + (last - first) / 2;
  return __dadd_rn(top_sum(nodes, first, middle, level + 1, depth, 2 * index),
                   top_sum(nodes, middle, last, level + 1, depth, 2 * index + 1));
}

__global__ void __launch_bounds__(kTreeThreads)
    tree_kernel(const double* block_sums, std::uint64_t blocks, int depth, double* sum) {
  __shared__ double nodes[kTreeThreads];
  const unsigned t = threadIdx.x;
  if (t < (1u << depth)) {
    std::uint64_t first = 0;
    std::uint64_t last = blocks;
    for (int level = 0; level < depth; ++level) {
      const std::uint64_t middle = first + (last - first) / 2;
      if (((t >> (depth - 1 - level)) & 1u) == 0) {
        last = middle;
      } else {
        first = middle;
      }
    }
    nodes[t] = tree_sum(block_sums, first, last);
  }
  __syncthreads();
  if (t == 0) *sum = __dadd_rn(*sum, top_sum(nodes, 0, blocks, 0, depth, 0));
}

// The deepest depth <= kMaxTreeDepth whose ancestors are all inner nodes: node sizes at depth k
// are floor or ceil of blocks / 2^k, so depth k is all inner nodes when floor(blocks / 2^k) > 8.
int tree_depth(std::uint64_t blocks) {
  int depth = 0;
  while (depth < kMaxTreeDepth && (blocks >> depth) > kNormLeafBlocks) ++depth;
  return depth;
}

template <class T>
cudaError_t launch_block_sums(const SumOfSquaresOp& op, std::uint64_t blocks, cudaStream_t stream) {
  // One wave of warps is plenty for a read-only stream; at most one thread block per 8 norm blocks.
  constexpr std::uint64_t kMaxGrid = 4096;
  const std::uint64_t needed = (blocks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned grid = static_cast<unsigned>(needed < kMaxGrid ? needed : kMaxGrid);
  block_sums_kernel<T><<<grid, kWarpsPerBlock * 32, 0, stream>>>(static_cast<const T*>(op.src),
                                                                 op.count, op.block_sums);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_sum_of_squares(const SumOfSquaresOp& op, cudaStream_t stream) {
  if (op.count == 0) return cudaSuccess;
  const std::uint64_t blocks = (op.count + kNormBlockElems - 1) / kNormBlockElems;
  cudaError_t result = cudaErrorInvalidValue;
  switch (op.src_type) {
    case DType::kFp32:
      result = launch_block_sums<float>(op, blocks, stream);
      break;
    case DType::kBf16:
      result = launch_block_sums<Bf16>(op, blocks, stream);
      break;
    case DType::kFp16:
      result = launch_block_sums<Fp16>(op, blocks, stream);
      break;
    case DType::kUint8:
    case DType::kUint64:
      break;  // Stream::sum_of_squares asserts a floating type first
  }
  if (result != cudaSuccess) return result;
  tree_kernel<<<1, kTreeThreads, 0, stream>>>(op.block_sums, blocks, tree_depth(blocks), op.sum);
  return cudaGetLastError();
}

}  // namespace strata::tiers::detail
