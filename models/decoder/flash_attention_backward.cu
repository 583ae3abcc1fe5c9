// The tensor-core attention backward (flash_attention.hpp), FlashAttention-2's two-kernel form
// without atomics: dq_kernel owns 64 queries and walks their key tiles in order; dkdv_kernel owns
// 64 keys of one kv head and walks the group's query heads in head order, each over its query
// tiles in order. Both recompute P = exp(S - lse) from q, k and the forward's log-sum-exp, and
// dS = P ∘ (dP - delta) with dP = dO·Vᵀ and delta = rowsum(dO ∘ O). Tiles: [Note: flash
// attention tiles] in flash_attention_kernels.cuh.
#include <algorithm>
#include <cmath>

#include "models/decoder/flash_attention_kernels.cuh"

namespace strata::llm::cuda::flash {
namespace {

constexpr int kQueryRows = 32;  // query rows per tile streamed through dkdv_kernel

template <int kD>
struct DqShared {
  static constexpr int kBytes = 6 * Tile<kD>::kBytes;  // q, dout, then k and v double-buffered
};

template <int kD>
struct DkDvShared {
  using Keys = Tile<kD, kBlockRows>;
  using Queries = Tile<kD, kQueryRows>;
  // k, v; q and dout double-buffered; then lse, delta and first key per query, double-buffered.
  static constexpr int kRowFloats = 2 * kQueryRows;
  static constexpr int kBytes =
      2 * Keys::kBytes + 4 * Queries::kBytes + 3 * kRowFloats * static_cast<int>(sizeof(float));
};

__device__ __forceinline__ float to_float(float value) {
  return value;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 value) {
  return __bfloat162float(value);
}

constexpr int kDeltaThreads = 256;
constexpr int kDeltaRowsPerBlock = kDeltaThreads / kWarpSize;

// One warp per (sequence, head, query), lanes over the head's columns, a fixed butterfly sum.
template <typename T>
__global__ void __launch_bounds__(kDeltaThreads)
    delta_kernel(Problem p, const T* dout, std::size_t ld_dout, const T* out, std::size_t ld_out,
                 float* delta) {
  const std::size_t index =
      static_cast<std::size_t>(blockIdx.x) * kDeltaRowsPerBlock + threadIdx.x / kWarpSize;
  const std::size_t rows = static_cast<std::size_t>(p.sequences) * p.heads * p.positions;
  if (index >= rows) return;  // the whole warp leaves together
  const std::size_t query = index % p.positions;
  const std::size_t head = (index / p.positions) % p.heads;
  const std::size_t row =
      index / (static_cast<std::size_t>(p.positions) * p.heads) * p.positions + query;
  const T* g = dout + row * ld_dout + head * p.head_dim;
  const T* o = out + row * ld_out + head * p.head_dim;
  float sum = 0.0f;
  for (int c = lane_id(); c < p.head_dim; c += kWarpSize) sum += to_float(g[c]) * to_float(o[c]);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (lane_id() == 0) delta[index] = sum;
}

// dS = P ∘ (dP - delta) into `s`, P recomputed from the scores and the rows' lse (0 where the key
// is not visible to the row; interior tiles: every key visible).
__device__ __forceinline__ void scores_to_ds(float (&s)[kTileRows / 8][4],
                                             const float (&dp)[kTileRows / 8][4], const Problem& p,
                                             bool interior, int k0, int pair, int row_low,
                                             int row_high, int first_key_low, int first_key_high,
                                             float lse_low, float lse_high, float delta_low,
                                             float delta_high) {
#pragma unroll
  for (int j = 0; j < kTileRows / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool low = e < 2;
      const int key = k0 + j * 8 + pair + (e & 1);
      const bool seen = interior || (low ? visible(p, row_low, key, first_key_low)
                                         : visible(p, row_high, key, first_key_high));
      const float probability =
          seen ? exp2f(s[j][e] * p.scale_log2 - (low ? lse_low : lse_high)) : 0.0f;
      s[j][e] = probability * (dp[j][e] - (low ? delta_low : delta_high));  // dS
    }
  }
}

// dQ = scale·Σ_keys dS·K. Grid and rows as forward_kernel's.
template <int kD>
__global__ void __launch_bounds__(kThreads) dq_kernel(BackwardArgs args) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  using T = Tile<kD>;
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  __nv_bfloat16* dout_tile = q_tile + T::kElements;
  __nv_bfloat16* k_tiles = dout_tile + T::kElements;
  __nv_bfloat16* v_tiles = k_tiles + 2 * T::kElements;
  const Problem& p = args.problem;
  const int sequence = static_cast<int>(blockIdx.z);
  const int head = static_cast<int>(blockIdx.y);
  const int kv_head = head / p.group;
  const int q0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const std::size_t row0 = static_cast<std::size_t>(sequence) * p.positions;
  const __nv_bfloat16* k_base = args.k.data + row0 * args.k.ld + kv_head * p.head_dim;
  const __nv_bfloat16* v_base = args.v.data + row0 * args.v.ld + kv_head * p.head_dim;

  const FirstKeys first_keys = first_key_range<kBlockRows>(p, sequence, q0);
  const TileRange tiles = key_tiles(p, q0, first_keys.lowest);
  const int tile_begin = tiles.begin;
  const int tile_end = tiles.end;

  load_tile_async<kD, kBlockRows>(q_tile, args.q.data + row0 * args.q.ld + head * p.head_dim,
                                  args.q.ld, q0, p.positions, p.head_dim);
  load_tile_async<kD, kBlockRows>(dout_tile,
                                  args.dout.data + row0 * args.dout.ld + head * p.head_dim,
                                  args.dout.ld, q0, p.positions, p.head_dim);
  if (tile_begin < tile_end) {
    const int k0 = tile_begin * kTileRows;
    load_tile_async<kD, kTileRows>(k_tiles, k_base, args.k.ld, k0, p.positions, p.head_dim);
    load_tile_async<kD, kTileRows>(v_tiles, v_base, args.v.ld, k0, p.positions, p.head_dim);
  }
  commit_async();

  const int warp_row0 = warp_id() * kWarpRows;
  const int row_low = q0 + warp_row0 + lane_id() / 4;
  const int row_high = row_low + 8;
  const int pair = (lane_id() % 4) * 2;
  const int first_key_low = first_key_of(p, sequence, row_low);
  const int first_key_high = first_key_of(p, sequence, row_high);
  const std::size_t lse_row0 = (static_cast<std::size_t>(sequence) * p.heads + head) * p.positions;
  // Rows past the sequence are masked; 0 keeps their arithmetic finite.
  const float lse_low = row_low < p.positions ? args.lse[lse_row0 + row_low] * kLog2e : 0.0f;
  const float lse_high = row_high < p.positions ? args.lse[lse_row0 + row_high] * kLog2e : 0.0f;
  const float delta_low = row_low < p.positions ? args.delta[lse_row0 + row_low] : 0.0f;
  const float delta_high = row_high < p.positions ? args.delta[lse_row0 + row_high] : 0.0f;

  float dq[kD / 8][4] = {};
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int buffer = (tile - tile_begin) & 1;
    prefetch_next_key_tiles<kD>(args, k_tiles, v_tiles, k_base, v_base, tile, tile_end, buffer);
    __syncthreads();
    const __nv_bfloat16* k_tile = k_tiles + buffer * T::kElements;
    const __nv_bfloat16* v_tile = v_tiles + buffer * T::kElements;

    float s[kTileRows / 8][4] = {};
    multiply_nk<kD, kTileRows>(s, q_tile, T::kStride, warp_row0, k_tile, T::kStride);
    float dp[kTileRows / 8][4] = {};
    multiply_nk<kD, kTileRows>(dp, dout_tile, T::kStride, warp_row0, v_tile, T::kStride);
    const int k0 = tile * kTileRows;
    const bool interior = tile_is_interior(p, q0, kBlockRows, k0, kTileRows, first_keys.highest);
    scores_to_ds(s, dp, p, interior, k0, pair, row_low, row_high, first_key_low, first_key_high,
                 lse_low, lse_high, delta_low, delta_high);
    multiply_kn<kTileRows, kD>(dq, s, k_tile, T::kStride);
    __syncthreads();  // this buffer is refilled next iteration
  }
  wait_async<0>();  // nothing may still be copying when the block ends (no key tile: q, dout)

  store_rows<kD>(dq, p.scale, p.scale, args.dq.data + row0 * args.dq.ld + head * p.head_dim,
                 args.dq.ld, row_low, p);
}

// The first query tile in [tile, end) with a query whose document starts at or before last_key;
// tiles after it whose queries all start later see none of the block's keys. Uniform per block.
__device__ __forceinline__ int next_query_tile(const Problem& p, int sequence, int tile, int end,
                                               int last_key) {
  if (p.first_key == nullptr) return tile;
  while (tile < end &&
         first_key_range<kQueryRows>(p, sequence, tile * kQueryRows).lowest > last_key) {
    ++tile;
  }
  return tile;
}

// The streamed side of dkdv_kernel: one head's q and dout rows, and their lse, delta and first
// keys, in shared memory (one of two buffers).
template <int kD>
struct QueryTiles {
  __nv_bfloat16* q;
  __nv_bfloat16* dout;
  float* lse;
  float* delta;
  int* first_key;

  __device__ QueryTiles(unsigned char* shared, int buffer) {
    using S = DkDvShared<kD>;
    auto* tiles = reinterpret_cast<__nv_bfloat16*>(shared) + 2 * S::Keys::kElements;
    q = tiles + buffer * S::Queries::kElements;
    dout = tiles + (2 + buffer) * S::Queries::kElements;
    auto* rows = reinterpret_cast<float*>(tiles + 4 * S::Queries::kElements);
    lse = rows + buffer * kQueryRows;
    delta = rows + S::kRowFloats + buffer * kQueryRows;
    first_key = reinterpret_cast<int*>(rows + 2 * S::kRowFloats) + buffer * kQueryRows;
  }

  __device__ void load(const BackwardArgs& args, int sequence, int head, int tile) const {
    const Problem& p = args.problem;
    const int q0 = tile * kQueryRows;
    const std::size_t row0 = static_cast<std::size_t>(sequence) * p.positions;
    load_tile_async<kD, kQueryRows>(q, args.q.data + row0 * args.q.ld + head * p.head_dim,
                                    args.q.ld, q0, p.positions, p.head_dim);
    load_tile_async<kD, kQueryRows>(dout, args.dout.data + row0 * args.dout.ld + head * p.head_dim,
                                    args.dout.ld, q0, p.positions, p.head_dim);
    const int i = static_cast<int>(threadIdx.x);
    if (i < kQueryRows) {
      // Zeros past the sequence: those queries are masked, and zeros keep them finite.
      const bool inside = q0 + i < p.positions;
      const int query = inside ? q0 + i : 0;
      const std::size_t index =
          (static_cast<std::size_t>(sequence) * p.heads + head) * p.positions + query;
      copy_4_async(lse + i, args.lse + index, inside);
      copy_4_async(delta + i, args.delta + index, inside);
      // Without documents nothing is read: any valid address will do.
      const bool documents = p.first_key != nullptr;
      const void* first_key_src = documents ? static_cast<const void*>(p.first_key + row0 + query)
                                            : static_cast<const void*>(args.lse + index);
      copy_4_async(first_key + i, first_key_src, inside && documents);
    }
  }
};

// Starts loading the next query tiles into the buffer other than `buffer`: tile `next_tile` of
// `head`, or once the head has none left, tile `tile_first` of the group's next head; then waits
// for the copies of the current ones.
template <int kD>
__device__ __forceinline__ void prefetch_next_query_tiles(const BackwardArgs& args,
                                                          unsigned char* shared_bytes, int sequence,
                                                          int head, int member, int tile_first,
                                                          int next_tile, int tile_end, int buffer) {
  const Problem& p = args.problem;
  if (next_tile < tile_end || member + 1 < p.group) {
    const bool same_head = next_tile < tile_end;
    QueryTiles<kD>(shared_bytes, buffer ^ 1)
        .load(args, sequence, same_head ? head : head + 1, same_head ? next_tile : tile_first);
    commit_async();
    wait_async<1>();
  } else {
    wait_async<0>();
  }
}

// The latest first key of the tile's queries (their documents' starts), the same in every lane.
template <int kD>
__device__ __forceinline__ int highest_first_key_of(const QueryTiles<kD>& queries) {
  int highest_first_key = 0;
#pragma unroll
  for (int i = 0; i < kQueryRows / kWarpSize; ++i) {
    highest_first_key = max(highest_first_key, queries.first_key[i * kWarpSize + lane_id()]);
  }
  highest_first_key = __reduce_max_sync(0xffffffffu, highest_first_key);
  return highest_first_key;
}

// Pᵀ into `st` and dSᵀ = Pᵀ ∘ (dPᵀ - delta) into `dpt`, P recomputed from the scores and the
// queries' lse (0 where the query does not see the key; interior tiles: every key visible).
template <int kD>
__device__ __forceinline__ void transposed_probabilities_and_ds(
    float (&st)[kQueryRows / 8][4], float (&dpt)[kQueryRows / 8][4], const Problem& p,
    const QueryTiles<kD>& queries, bool interior, int q0, int pair, int key_low, int key_high) {
#pragma unroll
  for (int j = 0; j < kQueryRows / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int column = j * 8 + pair + (e & 1);
      const int key = e < 2 ? key_low : key_high;
      const bool seen = interior || visible(p, q0 + column, key, queries.first_key[column]);
      const float probability =
          seen ? exp2f(st[j][e] * p.scale_log2 - queries.lse[column] * kLog2e) : 0.0f;
      st[j][e] = probability;
      dpt[j][e] = probability * (dpt[j][e] - queries.delta[column]);  // dSᵀ
    }
  }
}

// dV = Σ Pᵀ·dO and dK = scale·Σ dSᵀ·Q over the group's heads and the queries that see the keys.
// Grid (key tiles, kv heads, sequences); warp w owns keys k0 + 16w .. + 15 (early key tiles,
// seen by the most queries, are scheduled first).
template <int kD>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(BackwardArgs args) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  using S = DkDvShared<kD>;
  __nv_bfloat16* k_tile = reinterpret_cast<__nv_bfloat16*>(shared_bytes);
  __nv_bfloat16* v_tile = k_tile + S::Keys::kElements;
  const Problem& p = args.problem;
  const int sequence = static_cast<int>(blockIdx.z);
  const int kv_head = static_cast<int>(blockIdx.y);
  const int k0 = static_cast<int>(blockIdx.x) * kBlockRows;
  const std::size_t row0 = static_cast<std::size_t>(sequence) * p.positions;
  load_tile_async<kD, kBlockRows>(k_tile, args.k.data + row0 * args.k.ld + kv_head * p.head_dim,
                                  args.k.ld, k0, p.positions, p.head_dim);
  load_tile_async<kD, kBlockRows>(v_tile, args.v.data + row0 * args.v.ld + kv_head * p.head_dim,
                                  args.v.ld, k0, p.positions, p.head_dim);

  // Query tiles [tile_first, tile_end): from the diagonal to the last query the window lets see
  // the last key; tiles whose queries all belong to later documents are skipped
  // (next_query_tile).
  const int last_key = min(k0 + kBlockRows, p.positions) - 1;
  const int query_end = p.window == 0 ? p.positions : min(p.positions, last_key + p.window);
  const int tile_end = (query_end + kQueryRows - 1) / kQueryRows;
  const int tile_first = next_query_tile(p, sequence, k0 / kQueryRows, tile_end, last_key);
  if (tile_first < tile_end) {
    QueryTiles<kD>(shared_bytes, 0).load(args, sequence, kv_head * p.group, tile_first);
  }
  commit_async();

  const int warp_row0 = warp_id() * kWarpRows;
  const int key_low = k0 + warp_row0 + lane_id() / 4;
  const int key_high = key_low + 8;
  const int pair = (lane_id() % 4) * 2;
  float dk[kD / 8][4] = {};
  float dv[kD / 8][4] = {};
  int step = 0;
  for (int member = 0; member < p.group && tile_first < tile_end; ++member) {
    const int head = kv_head * p.group + member;
    for (int tile = tile_first; tile < tile_end; ++step) {
      const int next_tile = next_query_tile(p, sequence, tile + 1, tile_end, last_key);
      const int buffer = step & 1;
      prefetch_next_query_tiles<kD>(args, shared_bytes, sequence, head, member, tile_first,
                                    next_tile, tile_end, buffer);
      __syncthreads();
      const QueryTiles<kD> queries(shared_bytes, buffer);
      const int q0 = tile * kQueryRows;

      float st[kQueryRows / 8][4] = {};  // Sᵀ: this warp's keys × the tile's queries
      multiply_nk<kD, kQueryRows>(st, k_tile, S::Keys::kStride, warp_row0, queries.q,
                                  S::Queries::kStride);
      float dpt[kQueryRows / 8][4] = {};  // dPᵀ = V·dOᵀ
      multiply_nk<kD, kQueryRows>(dpt, v_tile, S::Keys::kStride, warp_row0, queries.dout,
                                  S::Queries::kStride);
      const int highest_first_key = highest_first_key_of(queries);
      const bool interior = tile_is_interior(p, q0, kQueryRows, k0, kBlockRows, highest_first_key);
      transposed_probabilities_and_ds(st, dpt, p, queries, interior, q0, pair, key_low, key_high);
      multiply_kn<kQueryRows, kD>(dv, st, queries.dout, S::Queries::kStride);
      multiply_kn<kQueryRows, kD>(dk, dpt, queries.q, S::Queries::kStride);
      __syncthreads();  // this buffer is refilled next step
      tile = next_tile;
    }
  }
  wait_async<0>();  // nothing may still be copying when the block ends (no query tile: k, v)

  store_rows<kD>(dk, p.scale, p.scale, args.dk.data + row0 * args.dk.ld + kv_head * p.head_dim,
                 args.dk.ld, key_low, p);
  store_rows<kD>(dv, 1.0f, 1.0f, args.dv.data + row0 * args.dv.ld + kv_head * p.head_dim,
                 args.dv.ld, key_low, p);
}

template <typename T>
cudaError_t launch_delta_for(const Problem& p, const T* dout, std::size_t ld_dout, const T* out,
                             std::size_t ld_out, float* delta, cudaStream_t stream) {
  const std::size_t rows = static_cast<std::size_t>(p.sequences) * p.heads * p.positions;
  const auto blocks = static_cast<unsigned>((rows + kDeltaRowsPerBlock - 1) / kDeltaRowsPerBlock);
  delta_kernel<T><<<blocks, kDeltaThreads, 0, stream>>>(p, dout, ld_dout, out, ld_out, delta);
  return cudaGetLastError();
}

template <int kD>
cudaError_t launch_gradients_for(const BackwardArgs& args, cudaStream_t stream) {
  const Problem& p = args.problem;
  constexpr int kDqBytes = DqShared<kD>::kBytes;
  constexpr int kDkDvBytes = DkDvShared<kD>::kBytes;
  cudaError_t result =
      cudaFuncSetAttribute(dq_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqBytes);
  if (result != cudaSuccess) return result;
  result = cudaFuncSetAttribute(dkdv_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                kDkDvBytes);
  if (result != cudaSuccess) return result;
  const dim3 dq_grid(static_cast<unsigned>((p.positions + kBlockRows - 1) / kBlockRows),
                     static_cast<unsigned>(p.heads), static_cast<unsigned>(p.sequences));
  dq_kernel<kD><<<dq_grid, kThreads, kDqBytes, stream>>>(args);
  result = cudaGetLastError();
  if (result != cudaSuccess) return result;
  const dim3 dkdv_grid(static_cast<unsigned>((p.positions + kBlockRows - 1) / kBlockRows),
                       static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.sequences));
  dkdv_kernel<kD><<<dkdv_grid, kThreads, kDkDvBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

std::size_t backward_shared_bytes(int head_dim) {
  return padded_head_dim(head_dim) == 64
             ? static_cast<std::size_t>(std::max(DqShared<64>::kBytes, DkDvShared<64>::kBytes))
             : static_cast<std::size_t>(std::max(DqShared<128>::kBytes, DkDvShared<128>::kBytes));
}

cudaError_t launch_delta(const Problem& p, const float* dout, std::size_t ld_dout, const float* out,
                         std::size_t ld_out, float* delta, cudaStream_t stream) {
  return launch_delta_for(p, dout, ld_dout, out, ld_out, delta, stream);
}

cudaError_t launch_delta(const Problem& p, const __nv_bfloat16* dout, std::size_t ld_dout,
                         const __nv_bfloat16* out, std::size_t ld_out, float* delta,
                         cudaStream_t stream) {
  return launch_delta_for(p, dout, ld_dout, out, ld_out, delta, stream);
}

cudaError_t launch_gradients(const BackwardArgs& args, cudaStream_t stream) {
  return padded_head_dim(args.problem.head_dim) == 64 ? launch_gradients_for<64>(args, stream)
                                                      : launch_gradients_for<128>(args, stream);
}

}  // namespace strata::llm::cuda::flash
