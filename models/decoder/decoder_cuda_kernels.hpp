// The decoder's element-wise, row-wise and attention work on a CUDA stream
// (decoder_cuda_kernels.cu): what norm_kernels, rope, mlp_kernels, attention and loss do on the
// host, over fp32 device pointers: the fp32 reference path's kernels (decoder_cuda.cpp), some of
// which the bf16 path reuses where its inputs are fp32 (the embedding, the norm backward, column
// sums, the fp32 attention over widened copies). The bf16 kernels are in fused_kernels.hpp;
// matrix products are not here (cuBLAS fp32 in decoder_cuda.cpp, cuBLASLt bf16 through
// cublaslt_gemm.hpp).
//
// Determinism: no atomics anywhere. Row-wise work gives each row one warp (fixed butterfly
// reductions); sums over rows are column_reduce.cuh's (each warp walks its rows in order, then
// the warps are added in order); the attention backward gives each key row one warp that walks
// the group's heads and the queries in order. Every result is the same bits run to run on one GPU.
// Each launcher returns cudaGetLastError() (cudaSuccess for empty work). Only CUDA-side sources
// include this header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::llm::cuda {

// The activations of hf_config.hpp's Activation, as the kernels take them.
enum class ActivationCode : int { kSilu = 0, kGeluTanh = 1, kGelu = 2 };

// dst [rows × cols] (row stride ld_dst) = bf16(src [rows × cols], row stride ld_src), rounded to
// nearest even.
cudaError_t cast_to_bf16(const float* src, std::size_t ld_src, __nv_bfloat16* dst,
                         std::size_t ld_dst, std::size_t rows, std::size_t cols,
                         cudaStream_t stream);

// x[row] = wte[inputs[row]] (+ wpe[row_positions[row]] when wpe is not null), rows × d.
cudaError_t embedding_forward(const std::int32_t* inputs, const float* wte, const float* wpe,
                              const std::uint32_t* row_positions, float* x, std::size_t rows,
                              std::size_t d, cudaStream_t stream);
// The same from bf16 tables: each value widened to fp32 before the sum, so the bits are those of
// embedding_forward on the tables widened.
cudaError_t embedding_forward_bf16(const std::int32_t* inputs, const __nv_bfloat16* wte,
                                   const __nv_bfloat16* wpe, const std::uint32_t* row_positions,
                                   float* x, std::size_t rows, std::size_t d,
                                   cudaStream_t stream);
// Rows grouped by an id (a token, a position), each group in row order: a stable counting sort.
struct RowIndex {
  const std::int32_t* offsets;  // [ids + 1]
  const std::int32_t* rows;     // [rows]
  std::size_t ids;
};
// out[v] = share[v] (or 0 when null) + Σ dx[row] over the rows of id v, in row order, v < ids.
// The embedding's backward: tokens into dwte (share: a tied head's part), positions into GPT-2's
// dwpe (ids: the table's rows; rows no position reaches get 0).
cudaError_t embedding_backward(const float* dx, RowIndex index, const float* share, float* out,
                               std::size_t d, cudaStream_t stream);

// out[r][c] = bias[c] for rows × cols with row stride ld.
cudaError_t broadcast_rows(const float* bias, float* out, std::size_t ld, std::size_t rows,
                           std::size_t cols, cudaStream_t stream);
// out[c] = Σ over rows, in order, of m[r·ld + c].
cudaError_t column_sums(const float* m, std::size_t ld, std::size_t rows, std::size_t cols,
                        float* out, cudaStream_t stream);
// out[i] += x[i].
cudaError_t add_in_place(float* out, const float* x, std::size_t count, cudaStream_t stream);

// RMSNorm: y = x·rstd·w, rstd = 1/sqrt(mean(x²) + eps), one rstd per row kept.
cudaError_t rms_norm_forward(const float* x, const float* weight, float* y, float* rstd,
                             std::size_t rows, std::size_t dim, float eps, cudaStream_t stream);
// dx += input gradient; dweight overwritten.
cudaError_t rms_norm_backward(const float* dy, const float* x, const float* rstd,
                              const float* weight, float* dx, float* dweight, std::size_t rows,
                              std::size_t dim, cudaStream_t stream);
// LayerNorm: y = (x - mean)·rstd·w + b.
cudaError_t layer_norm_forward(const float* x, const float* weight, const float* bias, float* y,
                               float* mean, float* rstd, std::size_t rows, std::size_t dim,
                               float eps, cudaStream_t stream);
// dx += input gradient; dweight, dbias overwritten.
cudaError_t layer_norm_backward(const float* dy, const float* x, const float* mean,
                                const float* rstd, const float* weight, float* dx, float* dweight,
                                float* dbias, std::size_t rows, std::size_t dim,
                                cudaStream_t stream);

// Rotary embedding in place on `heads` heads of each row of x [rows × ld] (head h at columns
// h·2·half); row r at position row_positions[r]; cos, sin [positions × half]. sign -1 applies
// the inverse (transpose) rotation: the backward.
cudaError_t rope_rotate(float* x, std::size_t ld, std::size_t rows, std::size_t heads,
                        std::size_t half, const std::uint32_t* row_positions, const float* cos,
                        const float* sin, float sign, cudaStream_t stream);

// Gated MLP: h = act(gate)·up over pre [rows × 2·inner] (gate | up).
cudaError_t gated_forward(ActivationCode act, const float* pre, float* h, std::size_t rows,
                          std::size_t inner, cudaStream_t stream);
cudaError_t gated_backward(ActivationCode act, const float* dh, const float* pre, float* dpre,
                           std::size_t rows, std::size_t inner, cudaStream_t stream);
// Plain MLP: h = act(pre); dpre = dh·act'(pre) (dpre may alias dh).
cudaError_t plain_forward(ActivationCode act, const float* pre, float* h, std::size_t count,
                          cudaStream_t stream);
cudaError_t plain_backward(ActivationCode act, const float* dh, const float* pre, float* dpre,
                           std::size_t count, cudaStream_t stream);

// Causal self-attention in fp32 on the CUDA cores: the reference for flash_attention.hpp's
// tensor-core kernels and the fallback for a head_dim they do not take (decoder_cuda.hpp).
// Tiled: no [positions × positions] matrix is ever stored. Each block
// takes 8 query rows of one (sequence, head) and streams the visible keys through shared memory
// 32 at a time with an online softmax (FlashAttention's forward); it keeps each query's
// log-sum-exp for the backward, which recomputes the probabilities tile by tile.
// q, k, v, out: rows of sequence b start at b·positions; strides ld_qkv (q, k, v) and ld_out.
// Query head h reads kv head h / (heads / kv_heads); window 0 means full causal attention,
// otherwise a query at p sees keys (p - window, p]; first_key (per row b·positions + i, device
// memory) keeps a query inside its packed document.
struct AttentionDims {
  std::size_t sequences, positions, heads, kv_heads, head_dim, window;
  const std::uint32_t* first_key;
};
inline constexpr std::size_t kMaxAttentionHeadDim = 128;
std::size_t attention_lse_floats(const AttentionDims& dims);  // sequences · heads · positions
cudaError_t attention_forward(const AttentionDims& dims, const float* q, const float* k,
                              const float* v, std::size_t ld_qkv, float* out, std::size_t ld_out,
                              float* lse, cudaStream_t stream);
// dq, dk, dv overwritten (dk, dv sum the group's heads in head order). delta: lse_floats of
// scratch (rowsum(dout ∘ out)).
cudaError_t attention_backward(const AttentionDims& dims, const float* dout, std::size_t ld_out,
                               const float* out, const float* q, const float* k, const float* v,
                               std::size_t ld_qkv, const float* lse, float* delta, float* dq,
                               float* dk, float* dv, cudaStream_t stream);

// Weighted next-token cross-entropy (loss.hpp): row_loss[r] = -log softmax(logits[r])[target],
// dlogits[r] = w_r·inv_weight·(softmax - onehot); rows of weight 0 get zeros.
cudaError_t weighted_cross_entropy(const float* logits, const std::int32_t* targets,
                                   const float* weights, float inv_weight, float* dlogits,
                                   double* row_loss, std::size_t rows, std::size_t vocab,
                                   cudaStream_t stream);

}  // namespace strata::llm::cuda
