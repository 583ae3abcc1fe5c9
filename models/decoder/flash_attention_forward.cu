// The tensor-core attention forward (flash_attention.hpp): FlashAttention-2's loop with one
// 64-query block per (tile, head, sequence) and the visible keys streamed 64 at a time (see
// [Note: flash attention tiles] in flash_attention_kernels.cuh).
#include <cmath>

#include "models/decoder/flash_attention_kernels.cuh"

namespace strata::llm::cuda::flash {
namespace {

template <int kD>
struct ForwardShared {
  static constexpr int kBytes = 5 * Tile<kD>::kBytes;  // q, then k and v double-buffered
};

// A query row's running softmax: the largest score so far (base-2 units) and the sum of this
// thread's exp2(score - max) over its columns (the quad's four partial sums add up at the end).
struct RunningRow {
  float max = -INFINITY;
  float sum = 0.0f;
};

// Folds one tile's scores of a row (half = 0: c0, c1 of each n-tile; 1: c2, c3) into `row`:
// scores become probabilities relative to the new max, and the factor that rescales what was
// accumulated before is returned. A row that has seen no visible key keeps max -inf; its
// exponent's shift is then 0 so that exp2(-inf) gives 0 rather than NaN.
__device__ __forceinline__ float fold_scores(float (&s)[kTileRows / 8][4], int half,
                                             RunningRow& row) {
  float tile_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kTileRows / 8; ++j) {
    tile_max = fmaxf(tile_max, fmaxf(s[j][2 * half], s[j][2 * half + 1]));
  }
  const float new_max = fmaxf(row.max, quad_max(tile_max));
  const float shift = new_max == -INFINITY ? 0.0f : new_max;
  const float correction = exp2f(row.max - shift);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kTileRows / 8; ++j) {
    s[j][2 * half] = exp2f(s[j][2 * half] - shift);
    s[j][2 * half + 1] = exp2f(s[j][2 * half + 1] - shift);
    sum += s[j][2 * half] + s[j][2 * half + 1];
  }
  row.max = new_max;
  row.sum = row.sum * correction + sum;
  return correction;
}

// A tile's scores in base-2 units, -inf where the key is not visible to the row (interior tiles:
// every key visible).
__device__ __forceinline__ void mask_scores(float (&s)[kTileRows / 8][4], const Problem& p,
                                            bool interior, int k0, int pair, int row_low,
                                            int row_high, int first_key_low, int first_key_high) {
#pragma unroll
  for (int j = 0; j < kTileRows / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k0 + j * 8 + pair + (e & 1);
      const bool seen = interior || (e < 2 ? visible(p, row_low, key, first_key_low)
                                           : visible(p, row_high, key, first_key_high));
      s[j][e] = seen ? s[j][e] * p.scale_log2 : -INFINITY;
    }
  }
}

// Rescales the output accumulated so far by the rows' softmax corrections.
template <int kD>
__device__ __forceinline__ void rescale_output(float (&o)[kD / 8][4], float correction_low,
                                               float correction_high) {
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    o[n][0] *= correction_low;
    o[n][1] *= correction_low;
    o[n][2] *= correction_high;
    o[n][3] *= correction_high;
  }
}

// The output rows divided by their softmax sums, stored (bf16 or fp32), and their log-sum-exp.
template <int kD, bool kBf16Out>
__device__ __forceinline__ void store_output_and_lse(const float (&o)[kD / 8][4],
                                                     const RunningRow& low, const RunningRow& high,
                                                     const ForwardArgs& args, int sequence,
                                                     int head, std::size_t row0, int row_low,
                                                     int row_high, int pair) {
  const Problem& p = args.problem;
  const float sum_low = quad_sum(low.sum);
  const float sum_high = quad_sum(high.sum);
  const float inverse_low = sum_low > 0.0f ? 1.0f / sum_low : 0.0f;
  const float inverse_high = sum_high > 0.0f ? 1.0f / sum_high : 0.0f;
  if constexpr (kBf16Out) {
    store_rows<kD>(o, inverse_low, inverse_high,
                   args.out_bf16.data + row0 * args.out_bf16.ld + head * p.head_dim,
                   args.out_bf16.ld, row_low, p);
  } else {
    store_rows<kD>(o, inverse_low, inverse_high,
                   args.out.data + row0 * args.out.ld + head * p.head_dim, args.out.ld, row_low, p);
  }
  // The natural-log log-sum-exp of the scaled scores, as the fp32 kernel keeps it.
  if (pair == 0) {
    const std::size_t lse_row0 =
        (static_cast<std::size_t>(sequence) * p.heads + head) * p.positions;
    if (row_low < p.positions) args.lse[lse_row0 + row_low] = (low.max + log2f(sum_low)) * kLn2;
    if (row_high < p.positions) {
      args.lse[lse_row0 + row_high] = (high.max + log2f(sum_high)) * kLn2;
    }
  }
}

// Grid (query tiles, heads, sequences); the latest query tiles, which see the most keys, are
// scheduled first so that the short ones fill the tail.
// kBf16Out: the output goes to args.out_bf16, rounded, else to args.out (one instantiation each,
// so neither carries the other's store code or registers).
template <int kD, bool kBf16Out>
__global__ void __launch_bounds__(kThreads) forward_kernel(ForwardArgs args) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  using T = Tile<kD>;
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  __nv_bfloat16* k_tiles = q_tile + T::kElements;
  __nv_bfloat16* v_tiles = k_tiles + 2 * T::kElements;
  const Problem& p = args.problem;
  const int sequence = static_cast<int>(blockIdx.z);
  const int head = static_cast<int>(blockIdx.y);
  const int kv_head = head / p.group;
  const int q0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const std::size_t row0 = static_cast<std::size_t>(sequence) * p.positions;
  const __nv_bfloat16* q_base = args.q.data + row0 * args.q.ld + head * p.head_dim;
  const __nv_bfloat16* k_base = args.k.data + row0 * args.k.ld + kv_head * p.head_dim;
  const __nv_bfloat16* v_base = args.v.data + row0 * args.v.ld + kv_head * p.head_dim;

  const FirstKeys first_keys = first_key_range<kBlockRows>(p, sequence, q0);
  const TileRange tiles = key_tiles(p, q0, first_keys.lowest);
  const int tile_begin = tiles.begin;
  const int tile_end = tiles.end;

  load_tile_async<kD, kBlockRows>(q_tile, q_base, args.q.ld, q0, p.positions, p.head_dim);
  if (tile_begin < tile_end) {
    const int k0 = tile_begin * kTileRows;
    load_tile_async<kD, kTileRows>(k_tiles, k_base, args.k.ld, k0, p.positions, p.head_dim);
    load_tile_async<kD, kTileRows>(v_tiles, v_base, args.v.ld, k0, p.positions, p.head_dim);
  }
  commit_async();

  const int warp_row0 = warp_id() * kWarpRows;
  const int row_low = q0 + warp_row0 + lane_id() / 4;  // c0, c1; c2, c3 are 8 rows down
  const int row_high = row_low + 8;
  const int first_key_low = first_key_of(p, sequence, row_low);
  const int first_key_high = first_key_of(p, sequence, row_high);
  const int pair = (lane_id() % 4) * 2;  // the first of the two columns a C fragment holds

  float o[kD / 8][4] = {};
  RunningRow low, high;
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int buffer = (tile - tile_begin) & 1;
    prefetch_next_key_tiles<kD>(args, k_tiles, v_tiles, k_base, v_base, tile, tile_end, buffer);
    __syncthreads();
    const __nv_bfloat16* k_tile = k_tiles + buffer * T::kElements;
    const __nv_bfloat16* v_tile = v_tiles + buffer * T::kElements;

    float s[kTileRows / 8][4] = {};
    multiply_nk<kD, kTileRows>(s, q_tile, T::kStride, warp_row0, k_tile, T::kStride);
    const int k0 = tile * kTileRows;
    const bool interior = tile_is_interior(p, q0, kBlockRows, k0, kTileRows, first_keys.highest);
    mask_scores(s, p, interior, k0, pair, row_low, row_high, first_key_low, first_key_high);
    const float correction_low = fold_scores(s, 0, low);
    const float correction_high = fold_scores(s, 1, high);
    rescale_output<kD>(o, correction_low, correction_high);
    multiply_kn<kTileRows, kD>(o, s, v_tile, T::kStride);
    __syncthreads();  // this buffer is refilled next iteration
  }
  wait_async<0>();  // nothing may still be copying when the block ends (no key tile: q)

  store_output_and_lse<kD, kBf16Out>(o, low, high, args, sequence, head, row0, row_low, row_high,
                                     pair);
}

template <int kD, bool kBf16Out>
cudaError_t launch_forward_for(const ForwardArgs& args, cudaStream_t stream) {
  constexpr int kBytes = ForwardShared<kD>::kBytes;
  const cudaError_t attribute = cudaFuncSetAttribute(
      forward_kernel<kD, kBf16Out>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  if (attribute != cudaSuccess) return attribute;
  const Problem& p = args.problem;
  const dim3 grid(static_cast<unsigned>((p.positions + kBlockRows - 1) / kBlockRows),
                  static_cast<unsigned>(p.heads), static_cast<unsigned>(p.sequences));
  forward_kernel<kD, kBf16Out><<<grid, kThreads, kBytes, stream>>>(args);
  return cudaGetLastError();
}

template <int kD>
cudaError_t launch_forward_for(const ForwardArgs& args, cudaStream_t stream) {
  return args.out_bf16.data != nullptr ? launch_forward_for<kD, true>(args, stream)
                                       : launch_forward_for<kD, false>(args, stream);
}

}  // namespace

std::size_t forward_shared_bytes(int head_dim) {
  return padded_head_dim(head_dim) == 64 ? ForwardShared<64>::kBytes : ForwardShared<128>::kBytes;
}

cudaError_t launch_forward(const ForwardArgs& args, cudaStream_t stream) {
  return padded_head_dim(args.problem.head_dim) == 64 ? launch_forward_for<64>(args, stream)
                                                      : launch_forward_for<128>(args, stream);
}

}  // namespace strata::llm::cuda::flash
