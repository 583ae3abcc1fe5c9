// The bf16 decoder's norms (fused_kernels.hpp): one warp per row, the row read from global
// memory once. Lane l takes the groups l, l + 32, l + 64, ... of 4 adjacent elements; a row of at
// most 32·4·kGroups elements (a multiple of 4, its rows 16-byte aligned) is loaded into
// registers as float4s, and the statistics and the outputs are computed from there. Other rows
// (odd or wide dims, unaligned views) take the same kernel with kGroups = 0, which reads each
// element from global memory where it is used, in the same order: both give the same bits.
// The per-element arithmetic is decoder_cuda_kernels.cu's (the same fp32 operations in the same
// order); the sums over a row are each lane's elements in group order, then warp_sum's butterfly.
#include <type_traits>

#include "models/decoder/column_reduce.cuh"
#include "models/decoder/fused_kernels.hpp"
#include "models/decoder/kernel_geometry.cuh"
#include "models/decoder/vector_access.cuh"

namespace strata::llm::cuda {
namespace {

using detail::kMaxRowElements;
using detail::kWarp;
using detail::lane_id;
using detail::warp_id;
using detail::warp_sum;

constexpr unsigned kGroup = 4;                   // elements per float4
constexpr unsigned kGroupSpan = kWarp * kGroup;  // a warp's elements per group index
constexpr int kMaxForwardGroups = 32;            // dims up to 4096 in registers
constexpr int kMaxBackwardGroups = 16;           // two rows held: dims up to 2048
// 4 warps (rows) per block: a lane holding 2 x 64 floats needs ~160 registers, which leaves room
// for 3 such blocks per SM (12 warps, so one block's loads overlap another's arithmetic) where
// 256-thread blocks would fit only one.
constexpr unsigned kNormThreads = 128;
constexpr unsigned kRowsPerBlock = kNormThreads / kWarp;

__device__ unsigned warp_row32() {
  return blockIdx.x * kRowsPerBlock + warp_id();
}
unsigned norm_blocks(std::size_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Calls f(k, base, n) for this lane's groups k: elements [base, base + n) of the row, in order.
template <int kGroups, class F>
__device__ void for_each_group(unsigned dim, F f) {
  const unsigned groups = kGroups > 0 ? kGroups : (dim + kGroupSpan - 1) / kGroupSpan;
#pragma unroll
  for (unsigned k = 0; k < groups; ++k) {
    const unsigned base = (lane_id() + k * kWarp) * kGroup;
    if (base < dim) f(k, base, min(kGroup, dim - base));
  }
}

// A group of p: one 16-byte load when wide (then n == 4), else n elements (the rest 0).
template <bool kWide>
__device__ void load_group(const float* p, unsigned base, unsigned n, float (&v)[kGroup]) {
  if constexpr (kWide) {
    const float4 q = *reinterpret_cast<const float4*>(p + base);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    for (unsigned j = 0; j < kGroup; ++j) v[j] = j < n ? p[base + j] : 0.0f;
  }
}
template <bool kWide>
__device__ void store_group(float* p, unsigned base, unsigned n, const float (&v)[kGroup]) {
  if constexpr (kWide) {
    *reinterpret_cast<float4*>(p + base) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    for (unsigned j = 0; j < n; ++j) p[base + j] = v[j];
  }
}
template <bool kWide>
__device__ void store_group(__nv_bfloat16* p, unsigned base, unsigned n, const float (&v)[kGroup]) {
  if constexpr (kWide) {
    uint2 raw;
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
    pairs[0] = __floats2bfloat162_rn(v[0], v[1]);
    pairs[1] = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(p + base) = raw;
  } else {
    for (unsigned j = 0; j < n; ++j) p[base + j] = __float2bfloat16_rn(v[j]);
  }
}

// One row of fp32 as this lane sees it: held in registers (kGroups > 0) or read where used.
template <int kGroups>
struct RowValues {
  float4 held[kGroups];
  __device__ RowValues(const float* row, unsigned dim) {
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
      const unsigned base = (lane_id() + k * kWarp) * kGroup;
      held[k] = base < dim ? *reinterpret_cast<const float4*>(row + base)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  __device__ void get(unsigned k, unsigned, unsigned, float (&v)[kGroup]) const {
    v[0] = held[k].x, v[1] = held[k].y, v[2] = held[k].z, v[3] = held[k].w;
  }
};
template <>
struct RowValues<0> {
  const float* row;
  __device__ RowValues(const float* p, unsigned) : row(p) {}
  __device__ void get(unsigned, unsigned base, unsigned n, float (&v)[kGroup]) const {
    load_group<false>(row, base, n, v);
  }
};

struct NormForwardArgs {
  const float *x, *weight, *bias;  // bias null: RMSNorm (mean 0)
  __nv_bfloat16* y;
  float *mean, *rstd;
  unsigned rows, dim;
  float eps;
};

// kWideParameters: weight and bias are read 16 bytes at once (a view the Engine hands may not be
// 16-byte aligned; the rows, the decoder's own buffers, are).
template <int kGroups, bool kWideParameters>
__global__ void __launch_bounds__(kNormThreads) norm_forward_bf16_kernel(NormForwardArgs a) {
  constexpr bool kWide = kGroups > 0;
  const unsigned row = warp_row32();
  if (row >= a.rows) return;  // the whole warp leaves together
  const std::size_t offset = static_cast<std::size_t>(row) * a.dim;
  const RowValues<kGroups> x(a.x + offset, a.dim);
  const float inv_dim = 1.0f / static_cast<float>(a.dim);
  float mu = 0.0f;
  if (a.bias != nullptr) {
    float sum = 0.0f;
    for_each_group<kGroups>(a.dim, [&](unsigned k, unsigned base, unsigned n) {
      float in[kGroup];
      x.get(k, base, n, in);
      for (unsigned j = 0; j < n; ++j) sum += in[j];
    });
    mu = warp_sum(sum) * inv_dim;
  }
  float sum_sq = 0.0f;
  for_each_group<kGroups>(a.dim, [&](unsigned k, unsigned base, unsigned n) {
    float in[kGroup];
    x.get(k, base, n, in);
    for (unsigned j = 0; j < n; ++j) sum_sq += (in[j] - mu) * (in[j] - mu);
  });
  const float s = rsqrtf(warp_sum(sum_sq) * inv_dim + a.eps);
  __nv_bfloat16* out = a.y + offset;
  for_each_group<kGroups>(a.dim, [&](unsigned k, unsigned base, unsigned n) {
    float in[kGroup], w[kGroup], y[kGroup];
    x.get(k, base, n, in);
    load_group<kWideParameters>(a.weight, base, n, w);
    if (a.bias != nullptr) {
      float b[kGroup];
      load_group<kWideParameters>(a.bias, base, n, b);
      for (unsigned j = 0; j < kGroup; ++j) y[j] = (in[j] - mu) * s * w[j] + b[j];
    } else {
      for (unsigned j = 0; j < kGroup; ++j) y[j] = in[j] * s * w[j];
    }
    store_group<kWide>(out, base, n, y);
  });
  if (lane_id() == 0) {
    a.mean[row] = mu;
    a.rstd[row] = s;
  }
}

struct NormBackwardArgs {
  const float *dy, *x, *mean, *rstd, *weight;  // mean null: RMSNorm
  float* dx;
  __nv_bfloat16* dx_bf16;
  unsigned rows, dim;
  bool accumulate;  // dx += the input gradient (else dx = 0.0f + it: the same bits as a memset)
};

// dx (+)= rstd·(w·dy - x·rstd²·mean(w·dy·x)) (RMSNorm) or
// rstd·(dxhat - mean(dxhat) - xhat·mean(dxhat·xhat)), dxhat = dy·w, xhat = (x - mu)·rstd
// (LayerNorm); dx_bf16 = bf16(dx).
template <int kGroups, bool kWideParameters>
__global__ void __launch_bounds__(kNormThreads) norm_backward_bf16_kernel(NormBackwardArgs a) {
  constexpr bool kWide = kGroups > 0;
  const unsigned row = warp_row32();
  if (row >= a.rows) return;
  const std::size_t offset = static_cast<std::size_t>(row) * a.dim;
  const RowValues<kGroups> g(a.dy + offset, a.dim);
  const RowValues<kGroups> x(a.x + offset, a.dim);
  const float s = a.rstd[row];
  const float mu = a.mean != nullptr ? a.mean[row] : 0.0f;
  const float inv_dim = 1.0f / static_cast<float>(a.dim);
  float first = 0.0f;   // RMS: Σ w·dy·x; LayerNorm: Σ dxhat
  float second = 0.0f;  // LayerNorm: Σ dxhat·xhat
  for_each_group<kGroups>(a.dim, [&](unsigned k, unsigned base, unsigned n) {
    float gv[kGroup], in[kGroup], w[kGroup];
    g.get(k, base, n, gv);
    x.get(k, base, n, in);
    load_group<kWideParameters>(a.weight, base, n, w);
    for (unsigned j = 0; j < n; ++j) {
      if (a.mean == nullptr) {
        first += w[j] * gv[j] * in[j];
      } else {
        const float dxhat = gv[j] * w[j];
        first += dxhat;
        second += dxhat * (in[j] - mu) * s;
      }
    }
  });
  const float mean_dot = a.mean == nullptr ? warp_sum(first) / static_cast<float>(a.dim) : 0.0f;
  const float mean_dxhat = a.mean != nullptr ? warp_sum(first) * inv_dim : 0.0f;
  const float mean_dxhat_xhat = a.mean != nullptr ? warp_sum(second) * inv_dim : 0.0f;
  float* dx = a.dx + offset;
  __nv_bfloat16* dx_bf16 = a.dx_bf16 + offset;
  for_each_group<kGroups>(a.dim, [&](unsigned k, unsigned base, unsigned n) {
    float gv[kGroup], in[kGroup], w[kGroup], d[kGroup] = {};
    g.get(k, base, n, gv);
    x.get(k, base, n, in);
    load_group<kWideParameters>(a.weight, base, n, w);
    if (a.accumulate) load_group<kWide>(dx, base, n, d);
    for (unsigned j = 0; j < kGroup; ++j) {
      if (a.mean == nullptr) {
        d[j] += s * (w[j] * gv[j] - in[j] * s * s * mean_dot);
      } else {
        const float xhat = (in[j] - mu) * s;
        d[j] += s * (gv[j] * w[j] - mean_dxhat - xhat * mean_dxhat_xhat);
      }
    }
    store_group<kWide>(dx, base, n, d);
    store_group<kWide>(dx_bf16, base, n, d);
  });
}

// Calls launch(std::integral_constant<int, G>, std::bool_constant<W>) with the register groups a
// row of `dim` needs (G = 4, 8, 16 or 32, at most kMost; rows 16-byte aligned) or G = 0, the
// element-wise form (a dim not a multiple of 4, unaligned rows, a row too wide), and W: whether
// the parameters are read 16 bytes at once (G > 0 and parameters_aligned).
template <int kMost, class Launch>
void with_register_groups(std::size_t dim, bool rows_aligned, bool parameters_aligned,
                          Launch launch) {
  static_assert(kMost == 16 || kMost == 32);
  const auto held = [&](auto groups) {
    if (parameters_aligned) {
      launch(groups, std::true_type{});
    } else {
      launch(groups, std::false_type{});
    }
  };
  const auto fits = [&](std::size_t groups) {
    return rows_aligned && dim % kGroup == 0 && dim <= groups * kGroupSpan;
  };
  if (fits(4)) {
    held(std::integral_constant<int, 4>{});
  } else if (fits(8)) {
    held(std::integral_constant<int, 8>{});
  } else if (fits(16)) {
    held(std::integral_constant<int, 16>{});
  } else if constexpr (kMost >= 32) {
    if (fits(32)) {
      held(std::integral_constant<int, 32>{});
    } else {
      launch(std::integral_constant<int, 0>{}, std::false_type{});
    }
  } else {
    launch(std::integral_constant<int, 0>{}, std::false_type{});
  }
}

bool rows_fit(std::size_t rows, std::size_t dim) {
  return rows < kMaxRowElements && dim < kMaxRowElements;
}

}  // namespace

cudaError_t norm_forward_bf16(const float* x, const float* weight, const float* bias,
                              __nv_bfloat16* y, float* mean, float* rstd, std::size_t rows,
                              std::size_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!rows_fit(rows, dim)) return cudaErrorInvalidValue;
  const NormForwardArgs args{
      x, weight, bias, y, mean, rstd, static_cast<unsigned>(rows), static_cast<unsigned>(dim), eps};
  const bool aligned = detail::wide_access({x, y}, {});
  const unsigned blocks = norm_blocks(rows);
  with_register_groups<kMaxForwardGroups>(
      dim, aligned, detail::wide_access({weight, bias}, {}),
      [&](auto groups, auto wide_parameters) {
        norm_forward_bf16_kernel<decltype(groups)::value, decltype(wide_parameters)::value>
            <<<blocks, kNormThreads, 0, stream>>>(args);
      });
  return cudaGetLastError();
}

cudaError_t norm_backward_bf16(const float* dy, const float* x, const float* mean,
                               const float* rstd, const float* weight, float* dx,
                               __nv_bfloat16* dx_bf16, float* dweight, float* dbias,
                               std::size_t rows, std::size_t dim, DxUpdate update,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!rows_fit(rows, dim)) return cudaErrorInvalidValue;
  const NormBackwardArgs args{dy,
                              x,
                              mean,
                              rstd,
                              weight,
                              dx,
                              dx_bf16,
                              static_cast<unsigned>(rows),
                              static_cast<unsigned>(dim),
                              update == DxUpdate::kAccumulate};
  const bool aligned = detail::wide_access({dy, x, dx, dx_bf16}, {});
  const unsigned blocks = norm_blocks(rows);
  with_register_groups<kMaxBackwardGroups>(
      dim, aligned, detail::wide_access({weight}, {}), [&](auto groups, auto wide_parameters) {
        norm_backward_bf16_kernel<decltype(groups)::value, decltype(wide_parameters)::value>
            <<<blocks, kNormThreads, 0, stream>>>(args);
      });
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  if (mean == nullptr) {
    return detail::column_reduce<1>(detail::RmsWeightTerm{dy, x, rstd, dim}, rows, dim, {{dweight}},
                                    stream);
  }
  return detail::column_reduce<2>(detail::LayerNormParameterTerm{dy, x, mean, rstd, dim}, rows, dim,
                                  {{dweight, dbias}}, stream);
}

}  // namespace strata::llm::cuda
