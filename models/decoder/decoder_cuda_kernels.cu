// The decoder's CUDA kernels (decoder_cuda_kernels.hpp). Row-wise kernels give each row one warp;
// element-wise kernels are grid-stride loops; sums over rows are column_reduce.cuh's (32 warps
// per 32 columns, each summing its rows in order, then the warps in order). The attention kernels are FlashAttention-style tiles: 8 rows per block (one
// per warp) against 32 streamed rows of the other side in shared memory, one lane per streamed
// row, so scores are computed and used tile by tile and never stored.
#include "models/decoder/decoder_cuda_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "models/decoder/activation_math.cuh"
#include "models/decoder/column_reduce.cuh"
#include "models/decoder/kernel_geometry.cuh"

namespace strata::llm::cuda {
namespace {

using detail::elementwise_blocks;
using detail::global_index;
using detail::grid_stride;
using detail::kThreads;
using detail::kWarp;
using detail::kWarpsPerBlock;
using detail::lane_id;
using detail::LayerNormParameterTerm;
using detail::RmsWeightTerm;
using detail::row_blocks;
using detail::warp_id;
using detail::warp_row;
using detail::warp_sum;

constexpr std::size_t kTile = kWarp;  // streamed rows per attention tile: one per lane
constexpr std::size_t kHd = kMaxAttentionHeadDim;
constexpr std::size_t kDimsPerLane = kHd / kWarp;
constexpr std::size_t kPad = kHd + 1;  // row stride of tiles read down a column (no bank clash)

unsigned one_per_thread_blocks(std::size_t count) {
  return static_cast<unsigned>((count + kThreads - 1) / kThreads);
}

__device__ float warp_max(float value) {
  for (unsigned offset = kWarp / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

using detail::activate;
using detail::derivative;

// --- element-wise and row-wise ------------------------------------------------------------------

__global__ void cast_to_bf16_kernel(const float* src, std::size_t ld_src, __nv_bfloat16* dst,
                                    std::size_t ld_dst, std::size_t rows, std::size_t cols) {
  for (std::size_t e = global_index(); e < rows * cols; e += grid_stride()) {
    const std::size_t r = e / cols;
    const std::size_t c = e % cols;
    dst[r * ld_dst + c] = __float2bfloat16_rn(src[r * ld_src + c]);
  }
}

__device__ inline float embedding_value(float value) { return value; }
__device__ inline float embedding_value(__nv_bfloat16 value) { return __bfloat162float(value); }

// T: float, or __nv_bfloat16 widened (exactly) before the sum.
template <typename T>
__global__ void embedding_forward_kernel(const std::int32_t* inputs, const T* wte, const T* wpe,
                                         const std::uint32_t* row_positions, float* x,
                                         std::size_t rows, std::size_t d) {
  for (std::size_t e = global_index(); e < rows * d; e += grid_stride()) {
    const std::size_t row = e / d;
    const std::size_t i = e % d;
    float value = embedding_value(wte[static_cast<std::size_t>(inputs[row]) * d + i]);
    if (wpe != nullptr) {
      value += embedding_value(wpe[static_cast<std::size_t>(row_positions[row]) * d + i]);
    }
    x[e] = value;
  }
}

// One thread per output element walks its id's rows in order.
__global__ void embedding_backward_kernel(const float* dx, RowIndex index, const float* share,
                                          float* out, std::size_t d) {
  const std::size_t e = global_index();
  if (e >= index.ids * d) return;
  const std::size_t id = e / d;
  const std::size_t i = e % d;
  float sum = share != nullptr ? share[e] : 0.0f;
  for (std::int32_t k = index.offsets[id]; k < index.offsets[id + 1]; ++k) {
    sum += dx[static_cast<std::size_t>(index.rows[k]) * d + i];
  }
  out[e] = sum;
}

__global__ void broadcast_rows_kernel(const float* bias, float* out, std::size_t ld,
                                      std::size_t rows, std::size_t cols) {
  for (std::size_t e = global_index(); e < rows * cols; e += grid_stride()) {
    out[(e / cols) * ld + e % cols] = bias[e % cols];
  }
}

// The term of column_sums (column_reduce.cuh; the norms' terms are there, shared with the bf16
// path's norm backward).
struct ColumnTerm {
  const float* m;
  std::size_t ld;
  __device__ void operator()(std::size_t r, std::size_t c, float (&sums)[1]) const {
    sums[0] += m[r * ld + c];
  }
};

__global__ void add_in_place_kernel(float* out, const float* x, std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) out[e] += x[e];
}

__global__ void rms_norm_forward_kernel(const float* x, const float* weight, float* y,
                                        float* rstd, std::size_t rows, std::size_t dim,
                                        float eps) {
  const std::size_t row = warp_row();
  if (row >= rows) return;  // the whole warp leaves together
  const float* in = x + row * dim;
  float sum_sq = 0.0f;
  for (std::size_t i = lane_id(); i < dim; i += kWarp) sum_sq += in[i] * in[i];
  const float s = rsqrtf(warp_sum(sum_sq) / static_cast<float>(dim) + eps);
  for (std::size_t i = lane_id(); i < dim; i += kWarp) y[row * dim + i] = in[i] * s * weight[i];
  if (lane_id() == 0) rstd[row] = s;
}

// dx += rstd·(w·dy - x·rstd²·mean(w·dy·x)).
__global__ void rms_norm_backward_dx_kernel(const float* dy, const float* x, const float* rstd,
                                            const float* weight, float* dx, std::size_t rows,
                                            std::size_t dim) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const float* g = dy + row * dim;
  const float* in = x + row * dim;
  float dot = 0.0f;
  for (std::size_t i = lane_id(); i < dim; i += kWarp) dot += weight[i] * g[i] * in[i];
  const float s = rstd[row];
  const float mean_dot = warp_sum(dot) / static_cast<float>(dim);
  for (std::size_t i = lane_id(); i < dim; i += kWarp) {
    dx[row * dim + i] += s * (weight[i] * g[i] - in[i] * s * s * mean_dot);
  }
}

__global__ void layer_norm_forward_kernel(const float* x, const float* weight, const float* bias,
                                          float* y, float* mean, float* rstd, std::size_t rows,
                                          std::size_t dim, float eps) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const float* in = x + row * dim;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  float sum = 0.0f;
  for (std::size_t i = lane_id(); i < dim; i += kWarp) sum += in[i];
  const float mu = warp_sum(sum) * inv_dim;
  float sum_sq = 0.0f;
  for (std::size_t i = lane_id(); i < dim; i += kWarp) sum_sq += (in[i] - mu) * (in[i] - mu);
  const float s = rsqrtf(warp_sum(sum_sq) * inv_dim + eps);
  for (std::size_t i = lane_id(); i < dim; i += kWarp) {
    y[row * dim + i] = (in[i] - mu) * s * weight[i] + bias[i];
  }
  if (lane_id() == 0) {
    mean[row] = mu;
    rstd[row] = s;
  }
}

// dx += s·(dxhat - mean(dxhat) - xhat·mean(dxhat·xhat)), dxhat = dy·w, xhat = (x - mu)·s.
__global__ void layer_norm_backward_dx_kernel(const float* dy, const float* x, const float* mean,
                                              const float* rstd, const float* weight, float* dx,
                                              std::size_t rows, std::size_t dim) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const float* g = dy + row * dim;
  const float* in = x + row * dim;
  const float mu = mean[row];
  const float s = rstd[row];
  float sum_dxhat = 0.0f;
  float sum_dxhat_xhat = 0.0f;
  for (std::size_t i = lane_id(); i < dim; i += kWarp) {
    const float dxhat = g[i] * weight[i];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * (in[i] - mu) * s;
  }
  const float inv_dim = 1.0f / static_cast<float>(dim);
  const float mean_dxhat = warp_sum(sum_dxhat) * inv_dim;
  const float mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) * inv_dim;
  for (std::size_t i = lane_id(); i < dim; i += kWarp) {
    const float xhat = (in[i] - mu) * s;
    dx[row * dim + i] += s * (g[i] * weight[i] - mean_dxhat - xhat * mean_dxhat_xhat);
  }
}

__global__ void rope_rotate_kernel(float* x, std::size_t ld, std::size_t rows, std::size_t heads,
                                   std::size_t half, const std::uint32_t* row_positions,
                                   const float* cos, const float* sin, float sign) {
  for (std::size_t e = global_index(); e < rows * heads * half; e += grid_stride()) {
    const std::size_t i = e % half;
    const std::size_t h = (e / half) % heads;
    const std::size_t r = e / (half * heads);
    const std::size_t position = row_positions[r];
    float* x1 = x + r * ld + h * 2 * half;
    float* x2 = x1 + half;
    const float c = cos[position * half + i];
    const float s = sign * sin[position * half + i];
    const float a = x1[i];
    const float b = x2[i];
    x1[i] = a * c - b * s;
    x2[i] = b * c + a * s;
  }
}

__global__ void gated_forward_kernel(ActivationCode act, const float* pre, float* h,
                                     std::size_t rows, std::size_t inner) {
  for (std::size_t e = global_index(); e < rows * inner; e += grid_stride()) {
    const std::size_t r = e / inner;
    const std::size_t i = e % inner;
    const float* gate = pre + r * 2 * inner;
    h[e] = activate(act, gate[i]) * gate[inner + i];
  }
}

__global__ void gated_backward_kernel(ActivationCode act, const float* dh, const float* pre,
                                      float* dpre, std::size_t rows, std::size_t inner) {
  for (std::size_t e = global_index(); e < rows * inner; e += grid_stride()) {
    const std::size_t r = e / inner;
    const std::size_t i = e % inner;
    const float gate = pre[r * 2 * inner + i];
    const float up = pre[r * 2 * inner + inner + i];
    dpre[r * 2 * inner + i] = dh[e] * up * derivative(act, gate);
    dpre[r * 2 * inner + inner + i] = dh[e] * activate(act, gate);
  }
}

__global__ void plain_forward_kernel(ActivationCode act, const float* pre, float* h,
                                     std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) h[e] = activate(act, pre[e]);
}

__global__ void plain_backward_kernel(ActivationCode act, const float* dh, const float* pre,
                                      float* dpre, std::size_t count) {
  for (std::size_t e = global_index(); e < count; e += grid_stride()) {
    dpre[e] = dh[e] * derivative(act, pre[e]);
  }
}

__global__ void weighted_cross_entropy_kernel(const float* logits, const std::int32_t* targets,
                                              const float* weights, float inv_weight,
                                              float* dlogits, double* row_loss, std::size_t rows,
                                              std::size_t vocab) {
  const std::size_t r = warp_row();
  if (r >= rows) return;
  const float* row = logits + r * vocab;
  float* drow = dlogits + r * vocab;
  if (weights[r] == 0.0f) {
    for (std::size_t i = lane_id(); i < vocab; i += kWarp) drow[i] = 0.0f;
    if (lane_id() == 0) row_loss[r] = 0.0;
    return;
  }
  float row_max = -INFINITY;
  for (std::size_t i = lane_id(); i < vocab; i += kWarp) row_max = fmaxf(row_max, row[i]);
  row_max = warp_max(row_max);
  float sum = 0.0f;
  for (std::size_t i = lane_id(); i < vocab; i += kWarp) sum += expf(row[i] - row_max);
  sum = warp_sum(sum);
  const float scale = weights[r] * inv_weight;
  const float softmax_scale = scale / sum;
  const auto target = static_cast<std::size_t>(targets[r]);
  for (std::size_t i = lane_id(); i < vocab; i += kWarp) {
    float value = expf(row[i] - row_max) * softmax_scale;
    if (i == target) value -= scale;
    drow[i] = value;
  }
  if (lane_id() == 0) {
    row_loss[r] = static_cast<double>(logf(sum)) - static_cast<double>(row[target] - row_max);
  }
}

// --- attention ------------------------------------------------------------------------------------

// Whether the query at position `query` of sequence b sees the key at `key`.
__device__ bool visible(const AttentionDims& dims, std::size_t b, std::size_t query,
                        std::size_t key) {
  return key <= query && (dims.window == 0 || query - key < dims.window) &&
         key >= dims.first_key[b * dims.positions + query];
}

// The first key any of the queries [first_query, ...] sees.
__device__ std::size_t first_key(std::size_t first_query, std::size_t window) {
  return window != 0 && first_query + 1 > window ? first_query + 1 - window : 0;
}

// Copies rows [first, first + kTile) (those < limit) of a head's columns into a tile with row
// stride `pad`; rows past the limit are zero.
__device__ void load_tile(float (*tile)[kPad], const float* base, std::size_t ld,
                          std::size_t first, std::size_t limit, std::size_t head_dim) {
  for (std::size_t e = threadIdx.x; e < kTile * head_dim; e += blockDim.x) {
    const std::size_t r = e / head_dim;
    const std::size_t c = e % head_dim;
    tile[r][c] = first + r < limit ? base[(first + r) * ld + c] : 0.0f;
  }
}

// One warp's dot product of a row it holds spread over lanes (dims lane + 32·t) with itself is not
// needed; dot of a shared row with a tile row, computed by one lane over all dims.
__device__ float row_dot(const float* a, const float* b, std::size_t head_dim) {
  float sum = 0.0f;
  for (std::size_t c = 0; c < head_dim; ++c) sum += a[c] * b[c];
  return sum;
}

// The rows of a query block: grid (query blocks of 8, heads, sequences); warp w holds query
// i = 8·block + w of head blockIdx.y (kv head: its group's) in sequence blockIdx.z.
struct QueryBlock {
  std::size_t sequence, head, kv_head, first_query, last_query, query;
  bool active;  // query < positions (the last block may be partial)

  __device__ explicit QueryBlock(const AttentionDims& dims)
      : sequence(blockIdx.z),
        head(blockIdx.y),
        kv_head(head / (dims.heads / dims.kv_heads)),
        first_query(static_cast<std::size_t>(blockIdx.x) * kWarpsPerBlock),
        last_query(min(first_query + kWarpsPerBlock, dims.positions) - 1),
        query(first_query + warp_id()),
        active(query < dims.positions) {}
};

// Grid and warps: QueryBlock.
__global__ void attention_forward_kernel(AttentionDims dims, const float* q, const float* k,
                                         const float* v, std::size_t ld_qkv, float* out,
                                         std::size_t ld_out, float* lse, float scale) {
  __shared__ float keys[kTile][kPad];
  __shared__ float values[kTile][kPad];
  __shared__ float queries[kWarpsPerBlock][kPad];
  const QueryBlock block(dims);
  const std::size_t hd = dims.head_dim;
  const std::size_t b = block.sequence, h = block.head, i = block.query;
  const bool active = block.active;
  const unsigned lane = lane_id();
  const float* q_b = q + b * dims.positions * ld_qkv + h * hd;
  const float* k_b = k + b * dims.positions * ld_qkv + block.kv_head * hd;
  const float* v_b = v + b * dims.positions * ld_qkv + block.kv_head * hd;
  for (std::size_t c = lane; c < hd; c += kWarp) {
    queries[warp_id()][c] = active ? q_b[i * ld_qkv + c] : 0.0f;
  }
  float running_max = -INFINITY;
  float running_sum = 0.0f;
  float acc[kDimsPerLane] = {};
  for (std::size_t tile = first_key(block.first_query, dims.window); tile <= block.last_query;
       tile += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_tile(keys, k_b, ld_qkv, tile, dims.positions, hd);
    load_tile(values, v_b, ld_qkv, tile, dims.positions, hd);
    __syncthreads();
    if (!active) continue;
    const std::size_t key = tile + lane;
    const bool seen = key < dims.positions && visible(dims, b, i, key);
    const float score = seen ? scale * row_dot(queries[warp_id()], keys[lane], hd) : -INFINITY;
    const float new_max = fmaxf(running_max, warp_max(score));
    if (new_max == -INFINITY) continue;  // nothing visible yet: uniform across the warp
    const float p = seen ? expf(score - new_max) : 0.0f;
    const float correction = expf(running_max - new_max);
    running_sum = running_sum * correction + warp_sum(p);
    for (std::size_t t = 0; t < kDimsPerLane; ++t) acc[t] *= correction;
    for (unsigned j = 0; j < kTile; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      if (pj == 0.0f) continue;
      for (std::size_t t = 0; t < kDimsPerLane; ++t) {
        const std::size_t c = lane + t * kWarp;
        if (c < hd) acc[t] += pj * values[j][c];
      }
    }
    running_max = new_max;
  }
  if (!active) return;
  const float inv_sum = 1.0f / running_sum;
  float* out_row = out + (b * dims.positions + i) * ld_out + h * hd;
  for (std::size_t t = 0; t < kDimsPerLane; ++t) {
    const std::size_t c = lane + t * kWarp;
    if (c < hd) out_row[c] = acc[t] * inv_sum;
  }
  if (lane == 0) {
    lse[(b * dims.heads + h) * dims.positions + i] = running_max + logf(running_sum);
  }
}

// delta[b, h, i] = Σ_c dout[i, h, c]·out[i, h, c]: one warp per (b, h, i).
__global__ void attention_delta_kernel(AttentionDims dims, const float* dout, const float* out,
                                       std::size_t ld_out, float* delta) {
  const std::size_t index = warp_row();
  if (index >= dims.sequences * dims.heads * dims.positions) return;
  const std::size_t i = index % dims.positions;
  const std::size_t h = (index / dims.positions) % dims.heads;
  const std::size_t b = index / (dims.positions * dims.heads);
  const std::size_t offset = (b * dims.positions + i) * ld_out + h * dims.head_dim;
  float sum = 0.0f;
  for (std::size_t c = lane_id(); c < dims.head_dim; c += kWarp) {
    sum += dout[offset + c] * out[offset + c];
  }
  sum = warp_sum(sum);
  if (lane_id() == 0) delta[index] = sum;
}

// dQ_i = scale·Σ_j dS_ij·K_j, dS_ij = P_ij·(dO_i·V_j - delta_i), P_ij = exp(S_ij - lse_i).
// Grid and warps as in the forward.
__global__ void attention_dq_kernel(AttentionDims dims, const float* dout, std::size_t ld_out,
                                    const float* q, const float* k, const float* v,
                                    std::size_t ld_qkv, const float* lse, const float* delta,
                                    float* dq, float scale) {
  __shared__ float keys[kTile][kPad];
  __shared__ float values[kTile][kPad];
  __shared__ float queries[kWarpsPerBlock][kPad];
  __shared__ float grads[kWarpsPerBlock][kPad];
  const QueryBlock block(dims);
  const std::size_t hd = dims.head_dim;
  const std::size_t b = block.sequence, h = block.head, i = block.query;
  const bool active = block.active;
  const unsigned lane = lane_id();
  const float* q_b = q + b * dims.positions * ld_qkv + h * hd;
  const float* k_b = k + b * dims.positions * ld_qkv + block.kv_head * hd;
  const float* v_b = v + b * dims.positions * ld_qkv + block.kv_head * hd;
  const float* dout_b = dout + b * dims.positions * ld_out + h * hd;
  for (std::size_t c = lane; c < hd; c += kWarp) {
    queries[warp_id()][c] = active ? q_b[i * ld_qkv + c] : 0.0f;
    grads[warp_id()][c] = active ? dout_b[i * ld_out + c] : 0.0f;
  }
  const std::size_t row = (b * dims.heads + h) * dims.positions + i;
  const float row_lse = active ? lse[row] : 0.0f;
  const float row_delta = active ? delta[row] : 0.0f;
  float acc[kDimsPerLane] = {};
  for (std::size_t tile = first_key(block.first_query, dims.window); tile <= block.last_query;
       tile += kTile) {
    __syncthreads();
    load_tile(keys, k_b, ld_qkv, tile, dims.positions, hd);
    load_tile(values, v_b, ld_qkv, tile, dims.positions, hd);
    __syncthreads();
    if (!active) continue;
    const std::size_t key = tile + lane;
    const bool seen = key < dims.positions && visible(dims, b, i, key);
    float ds = 0.0f;
    if (seen) {
      const float p = expf(scale * row_dot(queries[warp_id()], keys[lane], hd) - row_lse);
      ds = p * (row_dot(grads[warp_id()], values[lane], hd) - row_delta);
    }
    for (unsigned j = 0; j < kTile; ++j) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
      if (dsj == 0.0f) continue;
      for (std::size_t t = 0; t < kDimsPerLane; ++t) {
        const std::size_t c = lane + t * kWarp;
        if (c < hd) acc[t] += dsj * keys[j][c];
      }
    }
  }
  if (!active) return;
  float* dq_row = dq + (b * dims.positions + i) * ld_qkv + h * hd;
  for (std::size_t t = 0; t < kDimsPerLane; ++t) {
    const std::size_t c = lane + t * kWarp;
    if (c < hd) dq_row[c] = scale * acc[t];
  }
}

// Adds P_mj·dO_m to dv_acc and dS_mj·Q_m to dk_acc (this lane's columns) for the tile's queries
// m in order, lane m holding query m's p and ds.
__device__ __forceinline__ void accumulate_dk_dv(float p, float ds,
                                                 const float (&queries)[kTile][kPad],
                                                 const float (&grads)[kTile][kPad], unsigned lane,
                                                 std::size_t hd, float (&dk_acc)[kDimsPerLane],
                                                 float (&dv_acc)[kDimsPerLane]) {
  for (unsigned m = 0; m < kTile; ++m) {
    const float pm = __shfl_sync(0xffffffffu, p, m);
    const float dsm = __shfl_sync(0xffffffffu, ds, m);
    if (pm == 0.0f && dsm == 0.0f) continue;
    for (std::size_t t = 0; t < kDimsPerLane; ++t) {
      const std::size_t c = lane + t * kWarp;
      if (c < hd) {
        dv_acc[t] += pm * grads[m][c];
        dk_acc[t] += dsm * queries[m][c];
      }
    }
  }
}

// Key j's dK (scaled) and dV rows of kv head g, this lane's columns.
__device__ __forceinline__ void store_dk_dv_row(const AttentionDims& dims, std::size_t b,
                                                std::size_t g, std::size_t j, std::size_t ld_qkv,
                                                std::size_t hd, unsigned lane, float scale,
                                                const float (&dk_acc)[kDimsPerLane],
                                                const float (&dv_acc)[kDimsPerLane], float* dk,
                                                float* dv) {
  float* dk_row = dk + (b * dims.positions + j) * ld_qkv + g * hd;
  float* dv_row = dv + (b * dims.positions + j) * ld_qkv + g * hd;
  for (std::size_t t = 0; t < kDimsPerLane; ++t) {
    const std::size_t c = lane + t * kWarp;
    if (c < hd) {
      dk_row[c] = scale * dk_acc[t];
      dv_row[c] = dv_acc[t];
    }
  }
}

// dV_j = Σ_h Σ_i P_ij·dO_i, dK_j = scale·Σ_h Σ_i dS_ij·Q_i over the group's heads in order and the
// queries that see key j in order. Grid: (key blocks of 8, kv heads, sequences); warp w holds
// key j = 8·block + w; the queries stream through shared memory 32 at a time.
__global__ void attention_dkdv_kernel(AttentionDims dims, const float* dout, std::size_t ld_out,
                                      const float* q, const float* k, const float* v,
                                      std::size_t ld_qkv, const float* lse, const float* delta,
                                      float* dk, float* dv, float scale) {
  __shared__ float queries[kTile][kPad];
  __shared__ float grads[kTile][kPad];
  __shared__ float tile_lse[kTile];
  __shared__ float tile_delta[kTile];
  __shared__ float key_rows[kWarpsPerBlock][kPad];
  __shared__ float value_rows[kWarpsPerBlock][kPad];
  const std::size_t hd = dims.head_dim;
  const std::size_t group = dims.heads / dims.kv_heads;
  const std::size_t b = blockIdx.z;
  const std::size_t g = blockIdx.y;
  const std::size_t first_key_row = static_cast<std::size_t>(blockIdx.x) * kWarpsPerBlock;
  const std::size_t j = first_key_row + warp_id();
  const bool active = j < dims.positions;
  const unsigned lane = lane_id();
  const float* k_b = k + b * dims.positions * ld_qkv + g * hd;
  const float* v_b = v + b * dims.positions * ld_qkv + g * hd;
  for (std::size_t c = lane; c < hd; c += kWarp) {
    key_rows[warp_id()][c] = active ? k_b[j * ld_qkv + c] : 0.0f;
    value_rows[warp_id()][c] = active ? v_b[j * ld_qkv + c] : 0.0f;
  }
  // Queries that see one of this block's keys: [first_key_row, last key + window - 1].
  const std::size_t last_key = min(first_key_row + kWarpsPerBlock, dims.positions) - 1;
  const std::size_t query_end =
      dims.window == 0 ? dims.positions : min(dims.positions, last_key + dims.window);
  float dk_acc[kDimsPerLane] = {};
  float dv_acc[kDimsPerLane] = {};
  for (std::size_t member = 0; member < group; ++member) {
    const std::size_t h = g * group + member;
    const float* q_b = q + b * dims.positions * ld_qkv + h * hd;
    const float* dout_b = dout + b * dims.positions * ld_out + h * hd;
    const std::size_t row0 = (b * dims.heads + h) * dims.positions;
    for (std::size_t tile = first_key_row; tile < query_end; tile += kTile) {
      __syncthreads();
      load_tile(queries, q_b, ld_qkv, tile, dims.positions, hd);
      load_tile(grads, dout_b, ld_out, tile, dims.positions, hd);
      if (threadIdx.x < kTile) {
        const std::size_t query = tile + threadIdx.x;
        tile_lse[threadIdx.x] = query < dims.positions ? lse[row0 + query] : 0.0f;
        tile_delta[threadIdx.x] = query < dims.positions ? delta[row0 + query] : 0.0f;
      }
      __syncthreads();
      if (!active) continue;
      const std::size_t query = tile + lane;
      const bool seen = query < dims.positions && visible(dims, b, query, j);
      float p = 0.0f;
      float ds = 0.0f;
      if (seen) {
        p = expf(scale * row_dot(queries[lane], key_rows[warp_id()], hd) - tile_lse[lane]);
        ds = p * (row_dot(grads[lane], value_rows[warp_id()], hd) - tile_delta[lane]);
      }
      accumulate_dk_dv(p, ds, queries, grads, lane, hd, dk_acc, dv_acc);
    }
  }
  if (!active) return;
  store_dk_dv_row(dims, b, g, j, ld_qkv, hd, lane, scale, dk_acc, dv_acc, dk, dv);
}

dim3 attention_grid(std::size_t rows, std::size_t heads, std::size_t sequences) {
  return dim3(row_blocks(rows), static_cast<unsigned>(heads), static_cast<unsigned>(sequences));
}

float attention_scale(const AttentionDims& dims) {
  return 1.0f / std::sqrt(static_cast<float>(dims.head_dim));
}

}  // namespace

cudaError_t cast_to_bf16(const float* src, std::size_t ld_src, __nv_bfloat16* dst,
                         std::size_t ld_dst, std::size_t rows, std::size_t cols,
                         cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  cast_to_bf16_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(
      src, ld_src, dst, ld_dst, rows, cols);
  return cudaGetLastError();
}

cudaError_t embedding_forward(const std::int32_t* inputs, const float* wte, const float* wpe,
                              const std::uint32_t* row_positions, float* x, std::size_t rows,
                              std::size_t d, cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  embedding_forward_kernel<<<elementwise_blocks(rows * d), kThreads, 0, stream>>>(
      inputs, wte, wpe, row_positions, x, rows, d);
  return cudaGetLastError();
}

cudaError_t embedding_forward_bf16(const std::int32_t* inputs, const __nv_bfloat16* wte,
                                   const __nv_bfloat16* wpe, const std::uint32_t* row_positions,
                                   float* x, std::size_t rows, std::size_t d,
                                   cudaStream_t stream) {
  if (rows * d == 0) return cudaSuccess;
  embedding_forward_kernel<<<elementwise_blocks(rows * d), kThreads, 0, stream>>>(
      inputs, wte, wpe, row_positions, x, rows, d);
  return cudaGetLastError();
}

cudaError_t embedding_backward(const float* dx, RowIndex index, const float* share, float* out,
                               std::size_t d, cudaStream_t stream) {
  if (index.ids * d == 0) return cudaSuccess;
  embedding_backward_kernel<<<one_per_thread_blocks(index.ids * d), kThreads, 0, stream>>>(
      dx, index, share, out, d);
  return cudaGetLastError();
}

cudaError_t broadcast_rows(const float* bias, float* out, std::size_t ld, std::size_t rows,
                           std::size_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  broadcast_rows_kernel<<<elementwise_blocks(rows * cols), kThreads, 0, stream>>>(bias, out, ld,
                                                                                  rows, cols);
  return cudaGetLastError();
}

cudaError_t column_sums(const float* m, std::size_t ld, std::size_t rows, std::size_t cols,
                        float* out, cudaStream_t stream) {
  return detail::column_reduce<1>(ColumnTerm{m, ld}, rows, cols, {{out}}, stream);
}

cudaError_t add_in_place(float* out, const float* x, std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  add_in_place_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(out, x, count);
  return cudaGetLastError();
}

cudaError_t rms_norm_forward(const float* x, const float* weight, float* y, float* rstd,
                             std::size_t rows, std::size_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  rms_norm_forward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, weight, y, rstd, rows,
                                                                     dim, eps);
  return cudaGetLastError();
}

cudaError_t rms_norm_backward(const float* dy, const float* x, const float* rstd,
                              const float* weight, float* dx, float* dweight, std::size_t rows,
                              std::size_t dim, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  rms_norm_backward_dx_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, x, rstd, weight, dx,
                                                                         rows, dim);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  return detail::column_reduce<1>(RmsWeightTerm{dy, x, rstd, dim}, rows, dim, {{dweight}}, stream);
}

cudaError_t layer_norm_forward(const float* x, const float* weight, const float* bias, float* y,
                               float* mean, float* rstd, std::size_t rows, std::size_t dim,
                               float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  layer_norm_forward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, weight, bias, y, mean,
                                                                       rstd, rows, dim, eps);
  return cudaGetLastError();
}

cudaError_t layer_norm_backward(const float* dy, const float* x, const float* mean,
                                const float* rstd, const float* weight, float* dx, float* dweight,
                                float* dbias, std::size_t rows, std::size_t dim,
                                cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  layer_norm_backward_dx_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, x, mean, rstd,
                                                                           weight, dx, rows, dim);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  return detail::column_reduce<2>(LayerNormParameterTerm{dy, x, mean, rstd, dim}, rows, dim,
                                  {{dweight, dbias}}, stream);
}

cudaError_t rope_rotate(float* x, std::size_t ld, std::size_t rows, std::size_t heads,
                        std::size_t half, const std::uint32_t* row_positions, const float* cos,
                        const float* sin, float sign, cudaStream_t stream) {
  const std::size_t count = rows * heads * half;
  if (count == 0) return cudaSuccess;
  rope_rotate_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(
      x, ld, rows, heads, half, row_positions, cos, sin, sign);
  return cudaGetLastError();
}

cudaError_t gated_forward(ActivationCode act, const float* pre, float* h, std::size_t rows,
                          std::size_t inner, cudaStream_t stream) {
  if (rows * inner == 0) return cudaSuccess;
  gated_forward_kernel<<<elementwise_blocks(rows * inner), kThreads, 0, stream>>>(act, pre, h,
                                                                                 rows, inner);
  return cudaGetLastError();
}

cudaError_t gated_backward(ActivationCode act, const float* dh, const float* pre, float* dpre,
                           std::size_t rows, std::size_t inner, cudaStream_t stream) {
  if (rows * inner == 0) return cudaSuccess;
  gated_backward_kernel<<<elementwise_blocks(rows * inner), kThreads, 0, stream>>>(
      act, dh, pre, dpre, rows, inner);
  return cudaGetLastError();
}

cudaError_t plain_forward(ActivationCode act, const float* pre, float* h, std::size_t count,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  plain_forward_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(act, pre, h, count);
  return cudaGetLastError();
}

cudaError_t plain_backward(ActivationCode act, const float* dh, const float* pre, float* dpre,
                           std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  plain_backward_kernel<<<elementwise_blocks(count), kThreads, 0, stream>>>(act, dh, pre, dpre,
                                                                           count);
  return cudaGetLastError();
}

std::size_t attention_lse_floats(const AttentionDims& dims) {
  return dims.sequences * dims.heads * dims.positions;
}

cudaError_t attention_forward(const AttentionDims& dims, const float* q, const float* k,
                              const float* v, std::size_t ld_qkv, float* out, std::size_t ld_out,
                              float* lse, cudaStream_t stream) {
  if (dims.sequences * dims.positions == 0) return cudaSuccess;
  if (dims.head_dim > kMaxAttentionHeadDim) return cudaErrorInvalidValue;
  attention_forward_kernel<<<attention_grid(dims.positions, dims.heads, dims.sequences), kThreads,
                             0, stream>>>(dims, q, k, v, ld_qkv, out, ld_out, lse,
                                          attention_scale(dims));
  return cudaGetLastError();
}

cudaError_t attention_backward(const AttentionDims& dims, const float* dout, std::size_t ld_out,
                               const float* out, const float* q, const float* k, const float* v,
                               std::size_t ld_qkv, const float* lse, float* delta, float* dq,
                               float* dk, float* dv, cudaStream_t stream) {
  if (dims.sequences * dims.positions == 0) return cudaSuccess;
  if (dims.head_dim > kMaxAttentionHeadDim) return cudaErrorInvalidValue;
  const float scale = attention_scale(dims);
  attention_delta_kernel<<<row_blocks(attention_lse_floats(dims)), kThreads, 0, stream>>>(
      dims, dout, out, ld_out, delta);
  attention_dq_kernel<<<attention_grid(dims.positions, dims.heads, dims.sequences), kThreads, 0,
                        stream>>>(dims, dout, ld_out, q, k, v, ld_qkv, lse, delta, dq, scale);
  attention_dkdv_kernel<<<attention_grid(dims.positions, dims.kv_heads, dims.sequences), kThreads,
                          0, stream>>>(dims, dout, ld_out, q, k, v, ld_qkv, lse, delta, dk, dv,
                                       scale);
  return cudaGetLastError();
}

cudaError_t weighted_cross_entropy(const float* logits, const std::int32_t* targets,
                                   const float* weights, float inv_weight, float* dlogits,
                                   double* row_loss, std::size_t rows, std::size_t vocab,
                                   cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  weighted_cross_entropy_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(
      logits, targets, weights, inv_weight, dlogits, row_loss, rows, vocab);
  return cudaGetLastError();
}

}  // namespace strata::llm::cuda
