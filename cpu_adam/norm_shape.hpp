// The fixed shape of the gradient norm's reduction (grad_norm.hpp), which makes its bits a function
// of the gradients alone: a span is cut into blocks of kNormBlockElems elements; within a block,
// element i is squared in double and added, in order, to lane i % kNormLanes; the lanes are added
// in a halving tree (lane k += lane k + s for s = 16, 8, 4, 2, 1); the block sums are added in a
// binary tree that splits [first, last) at first + (last - first) / 2 down to leaves of at most
// kNormLeafBlocks blocks, each summed in order from 0. The CUDA norm (tiers/device/
// cuda_grad_norm.cu) follows the same shape. Plain C++17: the CUDA sources include it.
#pragma once

#include <cstddef>

namespace strata::cpu_adam {

inline constexpr std::size_t kNormBlockElems = 16 * 1024;

// 32 lanes give enough independent add chains to keep the FP units busy at every width
// (AVX-512: 4 accumulators, AVX2: 8, SSE2: 16); 16 lanes measured ~15% slower on cache-hot data.
inline constexpr std::size_t kNormLanes = 32;

// Blocks per leaf of the reduction tree: 8 x 16 Ki elements is ~0.5 MiB of fp32, long enough to
// amortise a task. The tree shape depends only on the block count, never on the threads.
inline constexpr std::size_t kNormLeafBlocks = 8;

}  // namespace strata::cpu_adam
