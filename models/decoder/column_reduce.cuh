// Sums over rows, one per column (a norm's weight gradient, a bias gradient), in parallel and in
// a fixed order, with no atomics: the same bits every run on one GPU.
//
// A block takes 32 adjacent columns, one per lane (a warp's loads are one 128-byte line), and
// kReduceWarps warps: warp w adds rows w, w + kReduceWarps, ... in order, then warp 0's lane c
// adds the warps' sums in warp order. That is kReduceWarps times the threads of one thread per
// column walking every row, which for a 2048-wide norm left most of an H200 idle (the first
// H200 run put the norms' weight gradients among 125 ms of element-wise time per step of a
// 1.08 B Llama at 8 x 1024 tokens).
//
// Term: a functor `void operator()(std::size_t row, std::size_t column, float (&sums)[N])` that
// adds the element's terms to the N running sums (N outputs: LayerNorm's weight and bias).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::llm::cuda::detail {

inline constexpr unsigned kReduceLanes = 32;
inline constexpr unsigned kReduceWarps = 32;
inline constexpr unsigned kReduceBatch = 8;  // rows a warp loads before adding them

template <int N>
struct ColumnOutputs {
  float* data[N];
};

template <int N, class Term>
__global__ void __launch_bounds__(kReduceLanes* kReduceWarps)
    column_reduce_kernel(Term term, std::size_t rows, std::size_t cols, ColumnOutputs<N> out) {
  __shared__ float partial[N][kReduceWarps][kReduceLanes + 1];
  const unsigned lane = threadIdx.x % kReduceLanes;
  const unsigned warp = threadIdx.x / kReduceLanes;
  const std::size_t column = static_cast<std::size_t>(blockIdx.x) * kReduceLanes + lane;
  float sums[N] = {};
  if (column < cols) {
    // kReduceBatch rows at a time with no branch between them, so that a warp has that many
    // rows' loads in flight, not one row's (with one, the 2048 warps of a 2048-wide reduction
    // waited on memory latency, not bandwidth); the adds stay in row order.
    std::size_t row = warp;
    for (; row + (kReduceBatch - 1) * kReduceWarps < rows; row += kReduceBatch * kReduceWarps) {
#pragma unroll
      for (unsigned b = 0; b < kReduceBatch; ++b) term(row + b * kReduceWarps, column, sums);
    }
    for (; row < rows; row += kReduceWarps) term(row, column, sums);
  }
  for (int i = 0; i < N; ++i) partial[i][warp][lane] = sums[i];
  __syncthreads();
  if (warp != 0 || column >= cols) return;
  for (int i = 0; i < N; ++i) {
    float total = 0.0f;
    for (unsigned w = 0; w < kReduceWarps; ++w) total += partial[i][w][lane];
    out.data[i][column] = total;
  }
}

// Launches column_reduce_kernel over `cols` columns on `stream`; returns cudaGetLastError().
template <int N, class Term>
cudaError_t column_reduce(Term term, std::size_t rows, std::size_t cols, ColumnOutputs<N> out,
                          cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((cols + kReduceLanes - 1) / kReduceLanes);
  column_reduce_kernel<N><<<blocks, kReduceLanes * kReduceWarps, 0, stream>>>(term, rows, cols,
                                                                              out);
  return cudaGetLastError();
}

// The norms' parameter gradients over fp32 dy and x [rows × dim], for the fp32 path's
// rms_norm_backward / layer_norm_backward and the bf16 path's norm_backward_bf16 alike.
struct RmsWeightTerm {  // dweight[c] = Σ_r dy·x·rstd
  const float *dy, *x, *rstd;
  std::size_t dim;
  __device__ void operator()(std::size_t r, std::size_t c, float (&sums)[1]) const {
    sums[0] += dy[r * dim + c] * x[r * dim + c] * rstd[r];
  }
};
struct LayerNormParameterTerm {  // dweight[c] = Σ_r dy·(x - mean)·rstd, dbias[c] = Σ_r dy
  const float *dy, *x, *mean, *rstd;
  std::size_t dim;
  __device__ void operator()(std::size_t r, std::size_t c, float (&sums)[2]) const {
    const float g = dy[r * dim + c];
    sums[0] += g * (x[r * dim + c] - mean[r]) * rstd[r];
    sums[1] += g;
  }
};

}  // namespace strata::llm::cuda::detail
