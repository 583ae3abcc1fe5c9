// The bf16 decoder's element-wise and loss kernels (fused_kernels.hpp; the norms are in
// fused_norms.cu). Element-wise work goes in chunks of 8 elements per thread (vector_access.cuh):
// rows in blockIdx.y and a row's chunks in x, or flat arrays strided by chunks, 16-byte accesses
// where the host found the pointers and strides aligned. The loss gives each row one block (a
// vocabulary row is long). The arithmetic per element is the same as before these kernels were
// vectorised (and as decoder_cuda_kernels.cu's where both exist): the same fp32 operations in
// the same order, on the same floats.
#include "models/decoder/fused_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "models/decoder/activation_math.cuh"
#include "models/decoder/column_reduce.cuh"
#include "models/decoder/kernel_geometry.cuh"
#include "models/decoder/vector_access.cuh"

namespace strata::llm::cuda {
namespace {

using bf16 = __nv_bfloat16;
using detail::activate;
using detail::chunks_of;
using detail::derivative;
using detail::for_each_chunk;
using detail::for_each_row_chunk;
using detail::kChunk;
using detail::kMaxRowElements;
using detail::kThreads;
using detail::kWarp;
using detail::kWarpsPerBlock;
using detail::lane_id;
using detail::load_chunk;
using detail::store_chunk;
using detail::warp_id;
using detail::wide_access;

unsigned flat_blocks(std::size_t count) {
  return detail::elementwise_blocks(chunks_of(count));
}
detail::ChunkLaunch row_launch(std::size_t rows, std::size_t cols) {
  return detail::chunk_launch(rows, chunks_of(cols));
}

// --- casts ---------------------------------------------------------------------------------------

__global__ void round_to_bf16_kernel(const float* src, bf16* dst, std::size_t count, bool wide) {
  for_each_chunk(count, [&](std::size_t first, unsigned n) {
    float v[kChunk];
    load_chunk(src + first, n, wide, v);
    store_chunk(dst + first, n, wide, v);
  });
}

__global__ void widen_to_fp32_kernel(const bf16* src, std::size_t ld_src, float* dst,
                                     std::size_t ld_dst, std::size_t rows, unsigned cols,
                                     bool wide) {
  for_each_row_chunk(rows, cols, [&](std::size_t r, unsigned c, unsigned n) {
    float v[kChunk];
    load_chunk(src + r * ld_src + c, n, wide, v);
    store_chunk(dst + r * ld_dst + c, n, wide, v);
  });
}

template <typename T>
__global__ void add_row_bias_kernel(T* d, std::size_t ld, std::size_t rows, unsigned cols,
                                    const T* bias, bool wide) {
  for_each_row_chunk(rows, cols, [&](std::size_t r, unsigned c, unsigned n) {
    float v[kChunk], b[kChunk];
    load_chunk(d + r * ld + c, n, wide, v);
    load_chunk(bias + c, n, wide, b);
    for (unsigned j = 0; j < kChunk; ++j) v[j] += b[j];
    store_chunk(d + r * ld + c, n, wide, v);
  });
}

// --- RoPE ----------------------------------------------------------------------------------------

// Where a row's rotated chunks are: head h's pairs (x1 at columns h·2·half + i, x2 half later),
// head_chunks chunks of i per head.
struct RopeRows {
  std::size_t ld, rows;
  unsigned half, head_chunks, rotated_units;
  const std::uint32_t* row_positions;
  const float *cos, *sin;
  bool wide;
};

// Unit u < rotated_units of a row: head h = u / head_chunks, pairs [i, i + n).
struct RopeUnit {
  unsigned column, i, n;
  __device__ RopeUnit(const RopeRows& g, unsigned u) {
    const unsigned h = u / g.head_chunks;
    i = (u - h * g.head_chunks) * kChunk;
    column = h * 2 * g.half + i;
    n = min(g.half - i, kChunk);
  }
};

__global__ void rope_forward_bf16_kernel(bf16* x, RopeRows g) {
  const unsigned u = detail::chunk_index();
  if (u >= g.rotated_units) return;
  const RopeUnit unit(g, u);
  for (std::size_t r = blockIdx.y; r < g.rows; r += gridDim.y) {
    const std::size_t angles = static_cast<std::size_t>(g.row_positions[r]) * g.half + unit.i;
    bf16* x1 = x + r * g.ld + unit.column;
    bf16* x2 = x1 + g.half;
    float a[kChunk], b[kChunk], c[kChunk], s[kChunk], o1[kChunk], o2[kChunk];
    load_chunk(x1, unit.n, g.wide, a);
    load_chunk(x2, unit.n, g.wide, b);
    load_chunk(g.cos + angles, unit.n, g.wide, c);
    load_chunk(g.sin + angles, unit.n, g.wide, s);
    for (unsigned j = 0; j < kChunk; ++j) {
      o1[j] = a[j] * c[j] - b[j] * s[j];
      o2[j] = b[j] * c[j] + a[j] * s[j];
    }
    store_chunk(x1, unit.n, g.wide, o1);
    store_chunk(x2, unit.n, g.wide, o2);
  }
}

// Units [0, rotated_units) rotate pairs back, the rest copy columns [copy_first, copy_end) in
// chunks; both write dx (fp32) and out (bf16).
__global__ void rope_backward_to_bf16_kernel(float* dx, bf16* out, RopeRows g, unsigned copy_first,
                                             unsigned copy_end) {
  const unsigned u = detail::chunk_index();
  if (u >= g.rotated_units) {
    const unsigned c = copy_first + (u - g.rotated_units) * kChunk;
    if (c >= copy_end) return;
    const unsigned n = min(copy_end - c, kChunk);
    for (std::size_t r = blockIdx.y; r < g.rows; r += gridDim.y) {
      float v[kChunk];
      load_chunk(dx + r * g.ld + c, n, g.wide, v);
      store_chunk(out + r * g.ld + c, n, g.wide, v);
    }
    return;
  }
  const RopeUnit unit(g, u);
  for (std::size_t r = blockIdx.y; r < g.rows; r += gridDim.y) {
    const std::size_t angles = static_cast<std::size_t>(g.row_positions[r]) * g.half + unit.i;
    const std::size_t c1 = r * g.ld + unit.column;
    const std::size_t c2 = c1 + g.half;
    float a[kChunk], b[kChunk], c[kChunk], s[kChunk], ra[kChunk], rb[kChunk];
    load_chunk(dx + c1, unit.n, g.wide, a);
    load_chunk(dx + c2, unit.n, g.wide, b);
    load_chunk(g.cos + angles, unit.n, g.wide, c);
    load_chunk(g.sin + angles, unit.n, g.wide, s);
    // The transpose of [c -s; s c]: decoder_cuda_kernels' rope_rotate with sign -1.
    for (unsigned j = 0; j < kChunk; ++j) {
      ra[j] = a[j] * c[j] - b[j] * (-s[j]);
      rb[j] = b[j] * c[j] + a[j] * (-s[j]);
    }
    store_chunk(dx + c1, unit.n, g.wide, ra);
    store_chunk(dx + c2, unit.n, g.wide, rb);
    store_chunk(out + c1, unit.n, g.wide, ra);
    store_chunk(out + c2, unit.n, g.wide, rb);
  }
}

// --- MLP activations -----------------------------------------------------------------------------

__global__ void gated_forward_bf16_kernel(ActivationCode act, const bf16* pre, bf16* h,
                                          std::size_t rows, unsigned inner, bool wide) {
  for_each_row_chunk(rows, inner, [&](std::size_t r, unsigned c, unsigned n) {
    const bf16* gate = pre + r * 2 * inner + c;
    float g[kChunk], up[kChunk], out[kChunk];
    load_chunk(gate, n, wide, g);
    load_chunk(gate + inner, n, wide, up);
    for (unsigned j = 0; j < kChunk; ++j) out[j] = activate(act, g[j]) * up[j];
    store_chunk(h + r * inner + c, n, wide, out);
  });
}

__global__ void gated_backward_bf16_kernel(ActivationCode act, const bf16* dh, const bf16* pre,
                                           bf16* dpre, std::size_t rows, unsigned inner,
                                           bool wide) {
  for_each_row_chunk(rows, inner, [&](std::size_t r, unsigned c, unsigned n) {
    const std::size_t at = r * 2 * inner + c;
    float gate[kChunk], up[kChunk], g[kChunk], dgate[kChunk], dup[kChunk];
    load_chunk(pre + at, n, wide, gate);
    load_chunk(pre + at + inner, n, wide, up);
    load_chunk(dh + r * inner + c, n, wide, g);
    for (unsigned j = 0; j < kChunk; ++j) {
      dgate[j] = g[j] * up[j] * derivative(act, gate[j]);
      dup[j] = g[j] * activate(act, gate[j]);
    }
    store_chunk(dpre + at, n, wide, dgate);
    store_chunk(dpre + at + inner, n, wide, dup);
  });
}

__global__ void plain_forward_bf16_kernel(ActivationCode act, const bf16* pre, bf16* h,
                                          std::size_t count, bool wide) {
  for_each_chunk(count, [&](std::size_t first, unsigned n) {
    float x[kChunk], out[kChunk];
    load_chunk(pre + first, n, wide, x);
    for (unsigned j = 0; j < kChunk; ++j) out[j] = activate(act, x[j]);
    store_chunk(h + first, n, wide, out);
  });
}

__global__ void plain_backward_bf16_kernel(ActivationCode act, const bf16* dh, const bf16* pre,
                                           bf16* dpre, std::size_t count, bool wide) {
  for_each_chunk(count, [&](std::size_t first, unsigned n) {
    float g[kChunk], x[kChunk], out[kChunk];
    load_chunk(dh + first, n, wide, g);
    load_chunk(pre + first, n, wide, x);
    for (unsigned j = 0; j < kChunk; ++j) out[j] = g[j] * derivative(act, x[j]);
    store_chunk(dpre + first, n, wide, out);
  });
}

struct Bf16ColumnTerm {
  const bf16* m;
  std::size_t ld;
  __device__ void operator()(std::size_t r, std::size_t c, float (&sums)[1]) const {
    sums[0] += __bfloat162float(m[r * ld + c]);
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

// A logit folded into a running pair with one exp.
__device__ void fold(SoftmaxSum& part, float x) {
  if (x > part.max) {
    part.sum = part.sum * expf(part.max - x) + 1.0f;
    part.max = x;
  } else {
    part.sum += expf(x - part.max);
  }
}

// One block per row: each thread folds its chunks of 8 logits (threads 256 chunks apart), the
// warps combine by butterflies and warp 0 combines the eight warps in order.
__global__ void cross_entropy_forward_kernel(const float* logits, const std::int32_t* targets,
                                             const float* weights, float* lse, double* row_loss,
                                             unsigned vocab, bool wide) {
  const std::size_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  SoftmaxSum part{-INFINITY, 0.0f};
  for (unsigned c = threadIdx.x * kChunk; c < vocab; c += kThreads * kChunk) {
    const unsigned n = min(vocab - c, kChunk);
    float x[kChunk];
    load_chunk(row + c, n, wide, x);
    for (unsigned j = 0; j < n; ++j) fold(part, x[j]);
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

// Rows in y, a row's chunks in x: no division per element.
__global__ void cross_entropy_backward_kernel(const float* logits, const float* lse,
                                              const std::int32_t* targets, const float* weights,
                                              float inv_weight, bf16* dlogits, std::size_t rows,
                                              unsigned vocab, bool wide) {
  for_each_row_chunk(rows, vocab, [&](std::size_t r, unsigned c, unsigned n) {
    const float scale = weights[r] * inv_weight;
    const float row_lse = lse[r];
    const auto target = static_cast<unsigned>(targets[r]);
    float x[kChunk], d[kChunk];
    load_chunk(logits + r * vocab + c, n, wide, x);
    for (unsigned j = 0; j < kChunk; ++j) {
      float value = 0.0f;
      if (scale != 0.0f) {
        value = expf(x[j] - row_lse) * scale;
        if (c + j == target) value -= scale;
      }
      d[j] = value;
    }
    store_chunk(dlogits + r * vocab + c, n, wide, d);
  });
}

// Whether a row width (or a flat count's chunk index) fits the kernels' 32-bit columns.
bool fits(std::size_t cols) {
  return cols < kMaxRowElements;
}

}  // namespace

cudaError_t round_to_bf16(const float* src, __nv_bfloat16* dst, std::size_t count,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  round_to_bf16_kernel<<<flat_blocks(count), kThreads, 0, stream>>>(src, dst, count,
                                                                    wide_access({src, dst}, {}));
  return cudaGetLastError();
}

cudaError_t widen_to_fp32(const __nv_bfloat16* src, std::size_t ld_src, float* dst,
                          std::size_t ld_dst, std::size_t rows, std::size_t cols,
                          cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  if (!fits(cols)) return cudaErrorInvalidValue;
  const detail::ChunkLaunch launch = row_launch(rows, cols);
  widen_to_fp32_kernel<<<launch.grid, launch.threads, 0, stream>>>(
      src, ld_src, dst, ld_dst, rows, static_cast<unsigned>(cols),
      wide_access({src, dst}, {ld_src, ld_dst}));
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_add_row_bias(T* d, std::size_t ld, std::size_t rows, std::size_t cols,
                                const T* bias, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  if (!fits(cols)) return cudaErrorInvalidValue;
  const detail::ChunkLaunch launch = row_launch(rows, cols);
  add_row_bias_kernel<<<launch.grid, launch.threads, 0, stream>>>(
      d, ld, rows, static_cast<unsigned>(cols), bias, wide_access({d, bias}, {ld}));
  return cudaGetLastError();
}

cudaError_t add_row_bias(float* d, std::size_t ld, std::size_t rows, std::size_t cols,
                         const float* bias, cudaStream_t stream) {
  return launch_add_row_bias(d, ld, rows, cols, bias, stream);
}

cudaError_t add_row_bias(__nv_bfloat16* d, std::size_t ld, std::size_t rows, std::size_t cols,
                         const __nv_bfloat16* bias, cudaStream_t stream) {
  return launch_add_row_bias(d, ld, rows, cols, bias, stream);
}

namespace {

// The rotated heads' geometry; false when a row is too wide for 32-bit columns.
bool rope_rows(std::size_t ld, std::size_t rows, std::size_t heads, std::size_t half,
               const std::uint32_t* row_positions, const float* cos, const float* sin,
               const void* x, const void* out, RopeRows& g) {
  if (!fits(ld) || !fits(2 * heads * half)) return false;
  const std::size_t head_chunks = chunks_of(half);
  g = RopeRows{ld,
               rows,
               static_cast<unsigned>(half),
               static_cast<unsigned>(head_chunks),
               static_cast<unsigned>(heads * head_chunks),
               row_positions,
               cos,
               sin,
               wide_access({x, out, cos, sin}, {ld, half})};
  return true;
}

}  // namespace

cudaError_t rope_forward_bf16(__nv_bfloat16* x, std::size_t ld, std::size_t rows, std::size_t heads,
                              std::size_t half, const std::uint32_t* row_positions,
                              const float* cos, const float* sin, cudaStream_t stream) {
  if (rows * heads * half == 0) return cudaSuccess;
  RopeRows g{};
  if (!rope_rows(ld, rows, heads, half, row_positions, cos, sin, x, nullptr, g)) {
    return cudaErrorInvalidValue;
  }
  const detail::ChunkLaunch launch = detail::chunk_launch(rows, g.rotated_units);
  rope_forward_bf16_kernel<<<launch.grid, launch.threads, 0, stream>>>(x, g);
  return cudaGetLastError();
}

cudaError_t rope_backward_to_bf16(float* dx, __nv_bfloat16* out, std::size_t ld, std::size_t rows,
                                  std::size_t cols, std::size_t heads, std::size_t half,
                                  const std::uint32_t* row_positions, const float* cos,
                                  const float* sin, cudaStream_t stream) {
  if (2 * heads * half > cols) return cudaErrorInvalidValue;
  if (rows * (cols - heads * half) == 0) return cudaSuccess;
  RopeRows g{};
  if (!fits(cols) || !rope_rows(ld, rows, heads, half, row_positions, cos, sin, dx, out, g)) {
    return cudaErrorInvalidValue;
  }
  const auto copy_first = static_cast<unsigned>(2 * heads * half);
  const std::size_t units = g.rotated_units + chunks_of(cols - copy_first);
  const detail::ChunkLaunch launch = detail::chunk_launch(rows, units);
  rope_backward_to_bf16_kernel<<<launch.grid, launch.threads, 0, stream>>>(
      dx, out, g, copy_first, static_cast<unsigned>(cols));
  return cudaGetLastError();
}

cudaError_t gated_forward_bf16(ActivationCode act, const __nv_bfloat16* pre, __nv_bfloat16* h,
                               std::size_t rows, std::size_t inner, cudaStream_t stream) {
  if (rows * inner == 0) return cudaSuccess;
  if (!fits(2 * inner)) return cudaErrorInvalidValue;
  const detail::ChunkLaunch launch = row_launch(rows, inner);
  gated_forward_bf16_kernel<<<launch.grid, launch.threads, 0, stream>>>(
      act, pre, h, rows, static_cast<unsigned>(inner), wide_access({pre, h}, {inner}));
  return cudaGetLastError();
}

cudaError_t gated_backward_bf16(ActivationCode act, const __nv_bfloat16* dh,
                                const __nv_bfloat16* pre, __nv_bfloat16* dpre, std::size_t rows,
                                std::size_t inner, cudaStream_t stream) {
  if (rows * inner == 0) return cudaSuccess;
  if (!fits(2 * inner)) return cudaErrorInvalidValue;
  const detail::ChunkLaunch launch = row_launch(rows, inner);
  gated_backward_bf16_kernel<<<launch.grid, launch.threads, 0, stream>>>(
      act, dh, pre, dpre, rows, static_cast<unsigned>(inner),
      wide_access({dh, pre, dpre}, {inner}));
  return cudaGetLastError();
}

cudaError_t plain_forward_bf16(ActivationCode act, const __nv_bfloat16* pre, __nv_bfloat16* h,
                               std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  plain_forward_bf16_kernel<<<flat_blocks(count), kThreads, 0, stream>>>(act, pre, h, count,
                                                                         wide_access({pre, h}, {}));
  return cudaGetLastError();
}

cudaError_t plain_backward_bf16(ActivationCode act, const __nv_bfloat16* dh,
                                const __nv_bfloat16* pre, __nv_bfloat16* dpre, std::size_t count,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  plain_backward_bf16_kernel<<<flat_blocks(count), kThreads, 0, stream>>>(
      act, dh, pre, dpre, count, wide_access({dh, pre, dpre}, {}));
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
  if (!fits(vocab) || !fits(rows)) return cudaErrorInvalidValue;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      logits, targets, weights, lse, row_loss, static_cast<unsigned>(vocab),
      wide_access({logits}, {vocab}));
  return cudaGetLastError();
}

cudaError_t cross_entropy_backward(const float* logits, const float* lse,
                                   const std::int32_t* targets, const float* weights,
                                   float inv_weight, __nv_bfloat16* dlogits, std::size_t rows,
                                   std::size_t vocab, cudaStream_t stream) {
  if (rows * vocab == 0) return cudaSuccess;
  if (!fits(vocab)) return cudaErrorInvalidValue;
  const detail::ChunkLaunch launch = row_launch(rows, vocab);
  cross_entropy_backward_kernel<<<launch.grid, launch.threads, 0, stream>>>(
      logits, lse, targets, weights, inv_weight, dlogits, rows, static_cast<unsigned>(vocab),
      wide_access({logits, dlogits}, {vocab}));
  return cudaGetLastError();
}

}  // namespace strata::llm::cuda
