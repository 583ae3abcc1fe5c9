// The bf16 decoder's element-wise and row-wise kernels (fused_kernels.hpp). Norms give each row
// one warp (as decoder_cuda_kernels.cu's), the loss one block per row (a vocabulary row is long),
// element-wise work is grid-stride loops over bf16 loaded into fp32 registers.
#include "models/decoder/fused_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "models/decoder/activation_math.cuh"
#include "models/decoder/column_reduce.cuh"
#include "models/decoder/kernel_geometry.cuh"

namespace strata::llm::cuda {
namespace {

using detail::activate;
using detail::derivative;

using detail::elementwise_blocks;
using detail::global_index;
using detail::grid_stride;
using detail::kMaxBlocks;
using detail::kThreads;
using detail::kWarp;
using detail::kWarpsPerBlock;
using detail::lane_id;
using detail::row_blocks;
using detail::warp_id;
using detail::warp_row;
using detail::warp_sum;

__device__ float load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ void store(__nv_bfloat16* p, float value) {
  *p = __float2bfloat16_rn(value);
}

// --- casts ---------------------------------------------------------------------------------------

__global__ void round_to_bf16_kernel(const float* src, __nv_bfloat16* dst, std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) store(dst + e, src[e]);
}

__global__ void widen_to_fp32_kernel(const __nv_bfloat16* src, std::size_t ld_src, float* dst,
                                     std::size_t ld_dst, std::size_t rows, std::size_t cols) {
  for (std::size_t e = global_index(); e < rows * cols; e += grid_stride()) {
    const std::size_t r = e / cols;
    const std::size_t c = e % cols;
    dst[r * ld_dst + c] = load(src + r * ld_src + c);
  }
}

template <typename T>
__global__ void add_row_bias_kernel(T* d, std::size_t ld, std::size_t rows, std::size_t cols,
                                    const T* bias) {
  for (std::size_t e = global_index(); e < rows * cols; e += grid_stride()) {
    T* at = d + (e / cols) * ld + e % cols;
    if constexpr (sizeof(T) == sizeof(float)) {
      *at += bias[e % cols];
    } else {
      store(at, load(at) + load(bias + e % cols));
    }
  }
}

// --- norms ---------------------------------------------------------------------------------------

// RMSNorm when bias is null, LayerNorm otherwise; the statistics as the fp32 kernels take them.
__global__ void norm_forward_bf16_kernel(const float* x, const float* weight, const float* bias,
                                         __nv_bfloat16* y, float* mean, float* rstd,
                                         std::size_t rows, std::size_t dim, float eps) {
  const std::size_t row = warp_row();
  if (row >= rows) return;  // the whole warp leaves together
  const float* in = x + row * dim;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  float mu = 0.0f;
  if (bias != nullptr) {
    float sum = 0.0f;
    for (std::size_t i = lane_id(); i < dim; i += kWarp) sum += in[i];
    mu = warp_sum(sum) * inv_dim;
  }
  float sum_sq = 0.0f;
  for (std::size_t i = lane_id(); i < dim; i += kWarp) sum_sq += (in[i] - mu) * (in[i] - mu);
  const float s = rsqrtf(warp_sum(sum_sq) * inv_dim + eps);
  __nv_bfloat16* out = y + row * dim;
  if (bias != nullptr) {
    for (std::size_t i = lane_id(); i < dim; i += kWarp) {
      store(out + i, (in[i] - mu) * s * weight[i] + bias[i]);
    }
  } else {
    for (std::size_t i = lane_id(); i < dim; i += kWarp) store(out + i, in[i] * s * weight[i]);
  }
  if (lane_id() == 0) {
    mean[row] = mu;
    rstd[row] = s;
  }
}

// --- RoPE ----------------------------------------------------------------------------------------

__global__ void rope_forward_bf16_kernel(__nv_bfloat16* x, std::size_t ld, std::size_t rows,
                                         std::size_t heads, std::size_t half,
                                         const std::uint32_t* row_positions, const float* cos,
                                         const float* sin) {
  for (std::size_t e = global_index(); e < rows * heads * half; e += grid_stride()) {
    const std::size_t i = e % half;
    const std::size_t h = (e / half) % heads;
    const std::size_t r = e / (half * heads);
    const std::size_t position = row_positions[r];
    __nv_bfloat16* x1 = x + r * ld + h * 2 * half + i;
    __nv_bfloat16* x2 = x1 + half;
    const float c = cos[position * half + i];
    const float s = sin[position * half + i];
    const float a = load(x1);
    const float b = load(x2);
    store(x1, a * c - b * s);
    store(x2, b * c + a * s);
  }
}

// One thread per rotated pair (the first heads·half units of a row) or per copied column.
__global__ void rope_backward_to_bf16_kernel(float* dx, __nv_bfloat16* out, std::size_t ld,
                                             std::size_t rows, std::size_t cols, std::size_t heads,
                                             std::size_t half, const std::uint32_t* row_positions,
                                             const float* cos, const float* sin) {
  const std::size_t pairs = heads * half;
  const std::size_t units = pairs + (cols - 2 * pairs);
  for (std::size_t e = global_index(); e < rows * units; e += grid_stride()) {
    const std::size_t r = e / units;
    const std::size_t u = e % units;
    if (u >= pairs) {
      const std::size_t c = 2 * pairs + (u - pairs);
      store(out + r * ld + c, dx[r * ld + c]);
      continue;
    }
    const std::size_t i = u % half;
    const std::size_t h = u / half;
    const std::size_t position = row_positions[r];
    const std::size_t c1 = r * ld + h * 2 * half + i;
    const std::size_t c2 = c1 + half;
    const float c = cos[position * half + i];
    const float s = sin[position * half + i];
    const float a = dx[c1];
    const float b = dx[c2];
    // The transpose of [c -s; s c]: decoder_cuda_kernels' rope_rotate with sign -1.
    const float ra = a * c - b * (-s);
    const float rb = b * c + a * (-s);
    dx[c1] = ra;
    dx[c2] = rb;
    store(out + c1, ra);
    store(out + c2, rb);
  }
}

// --- MLP activations -----------------------------------------------------------------------------

__global__ void gated_forward_bf16_kernel(ActivationCode act, const __nv_bfloat16* pre,
                                          __nv_bfloat16* h, std::size_t rows, std::size_t inner) {
  for (std::size_t e = global_index(); e < rows * inner; e += grid_stride()) {
    const __nv_bfloat16* gate = pre + (e / inner) * 2 * inner + e % inner;
    store(h + e, activate(act, load(gate)) * load(gate + inner));
  }
}

__global__ void gated_backward_bf16_kernel(ActivationCode act, const __nv_bfloat16* dh,
                                           const __nv_bfloat16* pre, __nv_bfloat16* dpre,
                                           std::size_t rows, std::size_t inner) {
  for (std::size_t e = global_index(); e < rows * inner; e += grid_stride()) {
    const std::size_t at = (e / inner) * 2 * inner + e % inner;
    const float gate = load(pre + at);
    const float up = load(pre + at + inner);
    const float g = load(dh + e);
    store(dpre + at, g * up * derivative(act, gate));
    store(dpre + at + inner, g * activate(act, gate));
  }
}

__global__ void plain_forward_bf16_kernel(ActivationCode act, const __nv_bfloat16* pre,
                                          __nv_bfloat16* h, std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) {
    store(h + e, activate(act, load(pre + e)));
  }
}

__global__ void plain_backward_bf16_kernel(ActivationCode act, const __nv_bfloat16* dh,
                                           const __nv_bfloat16* pre, __nv_bfloat16* dpre,
                                           std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) {
    store(dpre + e, load(dh + e) * derivative(act, load(pre + e)));
  }
}

struct Bf16ColumnTerm {
  const __nv_bfloat16* m;
  std::size_t ld;
  __device__ void operator()(std::size_t r, std::size_t c, float (&sums)[1]) const {
    sums[0] += load(m + r * ld + c);
  }
};

// --- the loss ------------------------------------------------------------------------------------

// A running (max, Σ exp(x - max)) pair; combining two is exact up to the exp's rounding.
struct SoftmaxSum {
  float max;
  float sum;
};
__device__ SoftmaxSum combine(SoftmaxSum a, SoftmaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// One block per row: each thread folds its strided logits, the warps combine by butterflies and
// warp 0 combines the eight warps in order.
__global__ void cross_entropy_forward_kernel(const float* logits, const std::int32_t* targets,
                                             const float* weights, float* lse, double* row_loss,
                                             std::size_t vocab) {
  const std::size_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  SoftmaxSum part{-INFINITY, 0.0f};
  for (std::size_t i = threadIdx.x; i < vocab; i += kThreads) {  // one exp per logit
    const float x = row[i];
    if (x > part.max) {
      part.sum = part.sum * expf(part.max - x) + 1.0f;
      part.max = x;
    } else {
      part.sum += expf(x - part.max);
    }
  }
  for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
    const SoftmaxSum other{__shfl_xor_sync(0xffffffffu, part.max, offset),
                           __shfl_xor_sync(0xffffffffu, part.sum, offset)};
    part = combine(part, other);
  }
  __shared__ SoftmaxSum warps[kWarpsPerBlock];
  if (lane_id() == 0) warps[warp_id()] = part;
  __syncthreads();
  if (threadIdx.x != 0) return;
  SoftmaxSum total = warps[0];
  for (unsigned w = 1; w < kWarpsPerBlock; ++w) total = combine(total, warps[w]);
  const float row_lse = total.max + logf(total.sum);
  lse[r] = row_lse;
  const float target_logit = row[static_cast<std::size_t>(targets[r])];
  row_loss[r] =
      weights[r] == 0.0f ? 0.0 : static_cast<double>(row_lse) - static_cast<double>(target_logit);
}

// Blocks over (column tiles of the vocabulary, rows): no division per element.
__global__ void cross_entropy_backward_kernel(const float* logits, const float* lse,
                                              const std::int32_t* targets, const float* weights,
                                              float inv_weight, __nv_bfloat16* dlogits,
                                              std::size_t rows, std::size_t vocab) {
  for (std::size_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float scale = weights[r] * inv_weight;
    const float row_lse = lse[r];
    const auto target = static_cast<std::size_t>(targets[r]);
    const float* row = logits + r * vocab;
    __nv_bfloat16* drow = dlogits + r * vocab;
    for (std::size_t i = global_index(); i < vocab; i += grid_stride()) {
      float value = 0.0f;
      if (scale != 0.0f) {
        value = expf(row[i] - row_lse) * scale;
        if (i == target) value -= scale;
      }
      store(drow + i, value);
    }
  }
}

}  // namespace

cudaError_t round_to_bf16(const float* src, __nv_bfloat16* dst, std::size_t count,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  round_to_bf16_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(src, dst, count);
  return cudaGetLastError();
}

cudaError_t widen_to_fp32(const __nv_bfloat16* src, std::size_t ld_src, float* dst,
                          std::size_t ld_dst, std::size_t rows, std::size_t cols,
                          cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  widen_to_fp32_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(
      src, ld_src, dst, ld_dst, rows, cols);
  return cudaGetLastError();
}

cudaError_t add_row_bias(float* d, std::size_t ld, std::size_t rows, std::size_t cols,
                         const float* bias, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  add_row_bias_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(d, ld, rows, cols,
                                                                                bias);
  return cudaGetLastError();
}

cudaError_t add_row_bias(__nv_bfloat16* d, std::size_t ld, std::size_t rows, std::size_t cols,
                         const __nv_bfloat16* bias, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  add_row_bias_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(d, ld, rows, cols,
                                                                                bias);
  return cudaGetLastError();
}

cudaError_t norm_forward_bf16(const float* x, const float* weight, const float* bias,
                              __nv_bfloat16* y, float* mean, float* rstd, std::size_t rows,
                              std::size_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  norm_forward_bf16_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, weight, bias, y, mean,
                                                                      rstd, rows, dim, eps);
  return cudaGetLastError();
}

cudaError_t rope_forward_bf16(__nv_bfloat16* x, std::size_t ld, std::size_t rows, std::size_t heads,
                              std::size_t half, const std::uint32_t* row_positions,
                              const float* cos, const float* sin, cudaStream_t stream) {
  const std::size_t count = rows * heads * half;
  if (count == 0) return cudaSuccess;
  rope_forward_bf16_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(
      x, ld, rows, heads, half, row_positions, cos, sin);
  return cudaGetLastError();
}

cudaError_t rope_backward_to_bf16(float* dx, __nv_bfloat16* out, std::size_t ld, std::size_t rows,
                                  std::size_t cols, std::size_t heads, std::size_t half,
                                  const std::uint32_t* row_positions, const float* cos,
                                  const float* sin, cudaStream_t stream) {
  if (2 * heads * half > cols) return cudaErrorInvalidValue;
  const std::size_t count = rows * (cols - heads * half);
  if (count == 0) return cudaSuccess;
  rope_backward_to_bf16_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(
      dx, out, ld, rows, cols, heads, half, row_positions, cos, sin);
  return cudaGetLastError();
}

cudaError_t gated_forward_bf16(ActivationCode act, const __nv_bfloat16* pre, __nv_bfloat16* h,
                               std::size_t rows, std::size_t inner, cudaStream_t stream) {
  if (rows * inner == 0) return cudaSuccess;
  gated_forward_bf16_kernel<<<elementwise_blocks(rows * inner), kThreads, 0, stream>>>(act, pre, h,
                                                                                       rows, inner);
  return cudaGetLastError();
}

cudaError_t gated_backward_bf16(ActivationCode act, const __nv_bfloat16* dh,
                                const __nv_bfloat16* pre, __nv_bfloat16* dpre, std::size_t rows,
                                std::size_t inner, cudaStream_t stream) {
  if (rows * inner == 0) return cudaSuccess;
  gated_backward_bf16_kernel<<<elementwise_blocks(rows * inner), kThreads, 0, stream>>>(
      act, dh, pre, dpre, rows, inner);
  return cudaGetLastError();
}

cudaError_t plain_forward_bf16(ActivationCode act, const __nv_bfloat16* pre, __nv_bfloat16* h,
                               std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  plain_forward_bf16_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(act, pre, h, count);
  return cudaGetLastError();
}

cudaError_t plain_backward_bf16(ActivationCode act, const __nv_bfloat16* dh,
                                const __nv_bfloat16* pre, __nv_bfloat16* dpre, std::size_t count,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  plain_backward_bf16_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(act, dh, pre, dpre,
                                                                                 count);
  return cudaGetLastError();
}

cudaError_t column_sums_bf16(const __nv_bfloat16* m, std::size_t ld, std::size_t rows,
                             std::size_t cols, float* out, cudaStream_t stream) {
  return detail::column_reduce<1>(Bf16ColumnTerm{m, ld}, rows, cols, {{out}}, stream);
}

cudaError_t cross_entropy_forward(const float* logits, const std::int32_t* targets,
                                  const float* weights, float* lse, double* row_loss,
                                  std::size_t rows, std::size_t vocab, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, targets, weights, lse, row_loss, vocab);
  return cudaGetLastError();
}

cudaError_t cross_entropy_backward(const float* logits, const float* lse,
                                   const std::int32_t* targets, const float* weights,
                                   float inv_weight, __nv_bfloat16* dlogits, std::size_t rows,
                                   std::size_t vocab, cudaStream_t stream) {
  if (rows * vocab == 0) return cudaSuccess;
  constexpr std::size_t kMaxRowBlocks = 65535;  // gridDim.y's limit; rows stride beyond
  const dim3 grid(static_cast<unsigned>(std::min<std::size_t>(
                      (vocab + 4 * kThreads - 1) / (4 * kThreads), kMaxBlocks)),
                  static_cast<unsigned>(std::min(rows, kMaxRowBlocks)));
  cross_entropy_backward_kernel<<<grid, kThreads, 0, stream>>>(logits, lse, targets, weights,
                                                               inv_weight, dlogits, rows, vocab);
  return cudaGetLastError();
}

}  // namespace strata::llm::cuda
