// Device-side building blocks of the tensor-core attention kernels (flash_attention_forward.cu,
// flash_attention_backward.cu): tile copies with cp.async, fragments with ldmatrix, products with
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate), and the masks. sm_80 and newer.
//
// [Note: flash attention tiles]
// Every kernel runs 4 warps (128 threads) on one 64-row block of its own side (queries for the
// forward and dq, keys for dk / dv); warp w owns rows [16w, 16w + 16), one mma A operand tall.
// The other side streams through shared memory 64 rows at a time, double-buffered with cp.async
// so the next tile loads while this one is multiplied. Tiles are bf16 [64 rows × kD] with kD the
// head_dim rounded up to 64 or 128 (zero columns past head_dim add nothing to a dot product) and
// a row stride of kD + 8 elements: the 8 rows one ldmatrix phase reads then start 16 bytes apart
// modulo 128, on distinct banks. Rows past `positions` are zero-filled by cp.async (src-size 0).
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"; g = lane / 4, t = lane % 4):
//   A (16 × 16, row): a0 (g, 2t..2t+1), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..)
//   B (16 × 8, col):  b0 (k 2t..2t+1, n g), b1 (k 2t + 8.., n g)
//   C (16 × 8, f32):  c0, c1 (g, 2t..2t+1), c2, c3 (g + 8, 2t..2t+1)
// ldmatrix.x4 gives register i the 8 × 8 matrix whose row addresses lanes 8i..8i+7 supply: lane l
// gets row l / 4, elements 2(l % 4), +1 (with .trans: that column, i.e. the transpose). So
//   - an A operand of a row-major tile: matrix i at rows + 8(i % 2), columns + 8(i / 2);
//   - a B operand of a tile stored [n][k] (keys × dims for Q·Kᵀ): no .trans, matrix i at
//     n + 8(i / 2), k + 8(i % 2): registers (0, 1) are b0, b1 of n-tile 0, (2, 3) of n-tile 1;
//   - a B operand of a tile stored [k][n] (keys × dims for P·V): .trans, matrix i at
//     k + 8(i % 2), n + 8(i / 2), the same register order.
// A C fragment of scores (keys 8j..8j + 7 in n-tile j) is, packed to bf16 pairs, the A fragment
// of the next product: 16 keys kk = n-tiles 2kk, 2kk + 1 give a0 = c0c1(2kk), a1 = c2c3(2kk),
// a2 = c0c1(2kk + 1), a3 = c2c3(2kk + 1). So P and dS never leave registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "models/decoder/flash_attention_launch.hpp"

namespace strata::llm::cuda::flash {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kWarpRows = 16;                   // one mma A operand's rows
constexpr int kBlockRows = kWarps * kWarpRows;  // the block's own rows
constexpr int kTileRows = 64;                   // streamed rows per tile
constexpr int kSkew = 8;                        // bf16 elements of padding per shared row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A bf16 [kRows × kD] tile in shared memory.
template <int kD, int kRows = kTileRows>
struct Tile {
  static_assert(kD % 16 == 0 && kRows % 16 == 0);
  static constexpr int kStride = kD + kSkew;
  static constexpr int kElements = kRows * kStride;
  static constexpr int kBytes = kElements * static_cast<int>(sizeof(__nv_bfloat16));
};

// The head-dim class of the kernels: 64 or 128.
constexpr int padded_head_dim(int head_dim) {
  return head_dim <= 64 ? 64 : 128;
}

// --- PTX wrappers -----------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared without passing L1; invalid copies write 16 zero bytes and read
// nothing (the source must still be a valid pointer).
__device__ __forceinline__ void copy_16_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_4_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void commit_async() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void load_matrix_x4(std::uint32_t (&r)[4], const __nv_bfloat16* at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(at)));
}
__device__ __forceinline__ void load_matrix_x4_trans(std::uint32_t (&r)[4],
                                                     const __nv_bfloat16* at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(at)));
}

// d += a·b on the tensor cores: a 16 × 16 bf16 (row), b 16 × 8 bf16 (col), d 16 × 8 fp32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (nearest even), `low` in the low half: the element of the lower
// column, as ldmatrix would have loaded it.
__device__ __forceinline__ std::uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  std::uint32_t bits;
  memcpy(&bits, &pair, sizeof(bits));
  return bits;
}

// --- fragment addresses (see the note) ---------------------------------------------------------

__device__ __forceinline__ int lane_id() {
  return static_cast<int>(threadIdx.x) % kWarpSize;
}
__device__ __forceinline__ int warp_id() {
  return static_cast<int>(threadIdx.x) / kWarpSize;
}

// This lane's row address for an A operand at (row0, k0) of a row-major tile.
__device__ __forceinline__ const __nv_bfloat16* a_address(const __nv_bfloat16* tile, int stride,
                                                          int row0, int k0) {
  const int matrix = lane_id() / 8;
  const int row = row0 + (matrix % 2) * 8 + lane_id() % 8;
  return tile + row * stride + k0 + (matrix / 2) * 8;
}
// B operands of n-tiles n0, n0 + 8 at k0, from a tile stored [n][k] (no .trans).
__device__ __forceinline__ const __nv_bfloat16* b_address_nk(const __nv_bfloat16* tile, int stride,
                                                             int n0, int k0) {
  const int matrix = lane_id() / 8;
  const int row = n0 + (matrix / 2) * 8 + lane_id() % 8;
  return tile + row * stride + k0 + (matrix % 2) * 8;
}
// B operands of n-tiles n0, n0 + 8 at k0, from a tile stored [k][n] (.trans).
__device__ __forceinline__ const __nv_bfloat16* b_address_kn(const __nv_bfloat16* tile, int stride,
                                                             int k0, int n0) {
  const int matrix = lane_id() / 8;
  const int row = k0 + (matrix % 2) * 8 + lane_id() % 8;
  return tile + row * stride + n0 + (matrix / 2) * 8;
}

// acc[n-tile][4] += A (16 × kK, row-major, rows row0.. of `a_tile`) · Bᵀ where B is stored [n][k]
// (rows n of `b_tile`): the score-like products Q·Kᵀ, dO·Vᵀ, K·Qᵀ, V·dOᵀ. kN columns.
template <int kK, int kN>
__device__ __forceinline__ void multiply_nk(float (&acc)[kN / 8][4], const __nv_bfloat16* a_tile,
                                            int a_stride, int row0, const __nv_bfloat16* b_tile,
                                            int b_stride) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    std::uint32_t a[4];
    load_matrix_x4(a, a_address(a_tile, a_stride, row0, kk * 16));
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      std::uint32_t b[4];
      load_matrix_x4(b, b_address_nk(b_tile, b_stride, np * 16, kk * 16));
      mma_bf16(acc[2 * np], a, b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc[n-tile][4] += P · B where P (16 × kK) is in registers as C fragments (kK / 8 n-tiles) and
// B [kK × kN] is stored [k][n] (rows k of `b_tile`): P·V, dS·K, Pᵀ·dO, dSᵀ·Q.
template <int kK, int kN>
__device__ __forceinline__ void multiply_kn(float (&acc)[kN / 8][4], const float (&p)[kK / 8][4],
                                            const __nv_bfloat16* b_tile, int b_stride) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const std::uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]),
                                pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                                pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int np = 0; np < kN / 16; ++np) {
      std::uint32_t b[4];
      load_matrix_x4_trans(b, b_address_kn(b_tile, b_stride, kk * 16, np * 16));
      mma_bf16(acc[2 * np], a, b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// --- tiles ------------------------------------------------------------------------------------

// Rows [first, first + kRows) of one head (head_dim columns from `base`, row stride ld) into a
// shared tile; rows at or past `limit` and columns past head_dim become zeros. Async: commit and
// wait before reading.
template <int kD, int kRows>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16* tile, const __nv_bfloat16* base,
                                                std::size_t ld, int first, int limit,
                                                int head_dim) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0);
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
    const int row = chunk / kChunksPerRow;
    const int column = (chunk % kChunksPerRow) * 8;
    const bool valid = first + row < limit && column < head_dim;
    const __nv_bfloat16* src =
        valid ? base + static_cast<std::size_t>(first + row) * ld + column : base;
    copy_16_async(tile + row * Tile<kD, kRows>::kStride + column, src, valid);
  }
}

// --- masks ------------------------------------------------------------------------------------

// Whether the query at `query` (its document starting at `query_first_key`) sees `key`: the
// fp32 kernel's visible(), plus both inside the sequence (tiles run past its end).
__device__ __forceinline__ bool visible(const Problem& p, int query, int key, int query_first_key) {
  return key <= query && query < p.positions && key >= query_first_key &&
         (p.window == 0 || query - key < p.window);
}

__device__ __forceinline__ int first_key_of(const Problem& p, int sequence, int query) {
  if (p.first_key == nullptr || query >= p.positions) return 0;
  return static_cast<int>(p.first_key[static_cast<std::size_t>(sequence) * p.positions + query]);
}

// The smallest and largest first key of the queries [q0, q0 + rows) inside the sequence. Every
// warp computes the same values with no shared memory, so a block branches on them uniformly.
struct FirstKeys {
  int lowest, highest;
};
template <int kRows>
__device__ __forceinline__ FirstKeys first_key_range(const Problem& p, int sequence, int q0) {
  if (p.first_key == nullptr) return {0, 0};
  int lowest = INT_MAX;
  int highest = 0;
#pragma unroll
  for (int i = 0; i < kRows / kWarpSize; ++i) {
    const int query = q0 + i * kWarpSize + lane_id();
    if (query < p.positions) {
      const int key = first_key_of(p, sequence, query);
      lowest = min(lowest, key);
      highest = max(highest, key);
    }
  }
  return {__reduce_min_sync(0xffffffffu, lowest), __reduce_max_sync(0xffffffffu, highest)};
}

// Starts loading key tile `tile + 1` (k and v) into the buffer other than `buffer` when there is
// one, then waits for the copies of tile `tile` (the forward's and the backward's loops over key
// tiles; Args: their launch arguments, with `problem`, `k` and `v`).
template <int kD, typename Args>
__device__ __forceinline__ void prefetch_next_key_tiles(
    const Args& args, __nv_bfloat16* k_tiles, __nv_bfloat16* v_tiles,
    const __nv_bfloat16* k_base, const __nv_bfloat16* v_base, int tile, int tile_end, int buffer) {
  using T = Tile<kD>;
  const Problem& p = args.problem;
  if (tile + 1 < tile_end) {
    // Into the buffer the previous iteration read; the barrier that ended it makes this safe.
    const int next = (tile + 1) * kTileRows;
    const int offset = (buffer ^ 1) * T::kElements;
    load_tile_async<kD, kTileRows>(k_tiles + offset, k_base, args.k.ld, next, p.positions,
                                   p.head_dim);
    load_tile_async<kD, kTileRows>(v_tiles + offset, v_base, args.v.ld, next, p.positions,
                                   p.head_dim);
    commit_async();
    wait_async<1>();
  } else {
    wait_async<0>();
  }
}

// Whether every (query, key) of queries [q0, q0 + q_rows) × keys [k0, k0 + k_rows) is visible,
// all inside the sequence: then the tile needs no mask. highest_first_key: the queries' largest.
__device__ __forceinline__ bool tile_is_interior(const Problem& p, int q0, int q_rows, int k0,
                                                 int k_rows, int highest_first_key) {
  return k0 + k_rows - 1 <= q0 && q0 + q_rows <= p.positions && k0 >= highest_first_key &&
         (p.window == 0 || q0 + q_rows - 1 - k0 < p.window);
}

// Key tiles [begin, end) that any query of [q0, q0 + kBlockRows) sees: from the first key its
// window or document lets in (lowest_first_key: the queries' smallest first key) to the diagonal.
struct TileRange {
  int begin, end;
};
__device__ __forceinline__ TileRange key_tiles(const Problem& p, int q0, int lowest_first_key) {
  int first_visible = lowest_first_key;
  if (p.window != 0 && q0 + 1 > p.window) first_visible = max(first_visible, q0 + 1 - p.window);
  return {first_visible / kTileRows, (min(q0 + kBlockRows, p.positions) - 1) / kTileRows + 1};
}

// A C fragment's two adjacent columns: fp32 as they are, or rounded to bf16 (nearest even) and
// stored as one pair (the column is even, the row's base 4-byte aligned).
__device__ __forceinline__ void store_pair(float* at, float first, float second) {
  at[0] = first;
  at[1] = second;
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* at, float first, float second) {
  *reinterpret_cast<__nv_bfloat162*>(at) = __floats2bfloat162_rn(first, second);
}

// Writes a warp's 16 rows of C fragments, rows row_low (c0, c1) and row_low + 8 (c2, c3) scaled
// by factor_low and factor_high, into `base` (row stride ld, fp32 or bf16): rows inside the
// sequence and columns below head_dim only (a multiple of 8: whole n-tiles).
template <int kD, typename Out>
__device__ __forceinline__ void store_rows(const float (&acc)[kD / 8][4], float factor_low,
                                           float factor_high, Out* base, std::size_t ld,
                                           int row_low, const Problem& p) {
  const int pair = (lane_id() % 4) * 2;
  if (row_low < p.positions) {
    Out* row = base + static_cast<std::size_t>(row_low) * ld + pair;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      if (n * 8 >= p.head_dim) break;
      store_pair(row + n * 8, acc[n][0] * factor_low, acc[n][1] * factor_low);
    }
  }
  if (row_low + 8 < p.positions) {
    Out* row = base + static_cast<std::size_t>(row_low + 8) * ld + pair;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      if (n * 8 >= p.head_dim) break;
      store_pair(row + n * 8, acc[n][2] * factor_high, acc[n][3] * factor_high);
    }
  }
}

// Reductions over the 4 lanes of a quad (the lanes that hold one row of a C fragment).
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

}  // namespace strata::llm::cuda::flash
