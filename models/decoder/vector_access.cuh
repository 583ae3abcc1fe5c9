// How the bf16 decoder's memory-bound kernels (fused_kernels.cu) touch memory: in chunks of 8
// elements, one 16-byte access for bf16 (two for fp32) where the host found every pointer 16-byte
// aligned and every row stride a whole number of chunks (`wide`), element by element otherwise
// and for a row's last, partial chunk. Either way a chunk holds the same floats, so the
// arithmetic on them, and the results, do not depend on which access was taken.
//
// Grids: rows in blockIdx.y (striding by gridDim.y past 65535 rows), a row's chunks in x, one per
// thread, so no thread divides an element index; column indices are 32-bit (the launchers refuse
// a row of 2³¹ elements or more). Flat arrays stride over chunks with 64-bit counters (additions
// only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "models/decoder/kernel_geometry.cuh"

namespace strata::llm::cuda::detail {

inline constexpr unsigned kChunk = 8;  // elements per thread and access
inline constexpr std::size_t kMaxRowElements = std::size_t{1} << 31;  // 32-bit column indices
inline constexpr std::size_t kMaxGridRows = 65535;                    // gridDim.y's limit

// Whether every pointer is 16-byte aligned (null counts as aligned) and every stride a multiple
// of kChunk elements: then every full chunk of every row is a 16-byte access.
inline bool wide_access(std::initializer_list<const void*> pointers,
                        std::initializer_list<std::size_t> strides) {
  for (const void* p : pointers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  for (const std::size_t stride : strides) {
    if (stride % kChunk != 0) return false;
  }
  return true;
}

inline std::size_t chunks_of(std::size_t count) {
  return (count + kChunk - 1) / kChunk;
}

// Rows in y, `chunks` chunks per row in x. A row of at most 1024 chunks is one block of whole
// warps (RoPE's 160 chunks per row would leave 96 of 256 threads idle), a longer one takes
// kThreads-thread blocks.
struct ChunkLaunch {
  dim3 grid;
  unsigned threads;
};
inline ChunkLaunch chunk_launch(std::size_t rows, std::size_t chunks) {
  constexpr std::size_t kMostThreads = 1024;
  const auto threads = static_cast<unsigned>(
      chunks <= kMostThreads ? std::max<std::size_t>(kWarp, (chunks + kWarp - 1) / kWarp * kWarp)
                             : kThreads);
  return {dim3(static_cast<unsigned>((chunks + threads - 1) / threads),
               static_cast<unsigned>(std::min(rows, kMaxGridRows))),
          threads};
}

// This thread's chunk of each of its rows.
__device__ inline unsigned chunk_index() {
  return blockIdx.x * blockDim.x + threadIdx.x;
}

// The first n (≤ kChunk) elements at p into v (the rest 0).
__device__ inline void load_chunk(const __nv_bfloat16* p, unsigned n, bool wide,
                                  float (&v)[kChunk]) {
  if (wide && n == kChunk) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    for (unsigned j = 0; j < kChunk / 2; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      v[2 * j] = f.x;
      v[2 * j + 1] = f.y;
    }
    return;
  }
  for (unsigned j = 0; j < kChunk; ++j) v[j] = j < n ? __bfloat162float(p[j]) : 0.0f;
}
__device__ inline void load_chunk(const float* p, unsigned n, bool wide, float (&v)[kChunk]) {
  if (wide && n == kChunk) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  for (unsigned j = 0; j < kChunk; ++j) v[j] = j < n ? p[j] : 0.0f;
}

// v's first n elements to p, bf16 rounded to nearest even (__floats2bfloat162_rn rounds each
// half as __float2bfloat16_rn does).
__device__ inline void store_chunk(__nv_bfloat16* p, unsigned n, bool wide,
                                   const float (&v)[kChunk]) {
  if (wide && n == kChunk) {
    uint4 raw;
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
    for (unsigned j = 0; j < kChunk / 2; ++j)
      pairs[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
    return;
  }
  for (unsigned j = 0; j < n; ++j) p[j] = __float2bfloat16_rn(v[j]);
}
__device__ inline void store_chunk(float* p, unsigned n, bool wide, const float (&v)[kChunk]) {
  if (wide && n == kChunk) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  for (unsigned j = 0; j < n; ++j) p[j] = v[j];
}

// The length of a chunk that starts `remaining` elements before the end.
__device__ inline unsigned chunk_length(std::size_t remaining) {
  return remaining < kChunk ? static_cast<unsigned>(remaining) : kChunk;
}

// Calls f(first, n) for this thread's chunks of a flat array of `count` elements (grid from
// elementwise_blocks(chunks_of(count))).
template <class F>
__device__ void for_each_chunk(std::size_t count, F f) {
  for (std::size_t first = global_index() * kChunk; first < count;
       first += grid_stride() * kChunk) {
    f(first, chunk_length(count - first));
  }
}

// Calls f(row, column, n) for this thread's chunk [column, column + n) of each of its rows of
// `cols` columns (launched by chunk_launch(rows, chunks_of(cols))).
template <class F>
__device__ void for_each_row_chunk(std::size_t rows, unsigned cols, F f) {
  const unsigned column = chunk_index() * kChunk;
  if (column >= cols) return;
  const unsigned n = min(cols - column, kChunk);
  for (std::size_t row = blockIdx.y; row < rows; row += gridDim.y) f(row, column, n);
}

}  // namespace strata::llm::cuda::detail
