// The bf16 CUDA decoder's element-wise and row-wise kernels (fused_kernels.cu): bf16 activations
// in and out, fp32 arithmetic inside, fp32 where the statistics live (norm mean and rstd, the
// loss's log-sum-exp). decoder_cuda_kernels.hpp keeps the fp32 reference path's kernels; the
// bf16 path reuses those whose inputs stay fp32 (the norm backward, the embedding, column sums).
//
// Rounding: every bf16 store rounds to nearest even (__float2bfloat16_rn).
// Determinism: no atomics. Row-wise kernels give each row one warp (the norms, fused_norms.cu)
// or one block (the loss) and combine partial results in a fixed butterfly / tree order;
// element-wise kernels compute each output from its own inputs only.
// Memory: made to run at memory bandwidth (strata-kernel-bench times each against a
// device-to-device copy): 16-byte accesses where the pointers and row strides allow, element by
// element otherwise (vector_access.cuh), the same results either way; 32-bit column indices
// (rows or row widths of 2³¹ elements or more are refused with cudaErrorInvalidValue).
// Profiler classes (tiers/device/gpu_profile.hpp sorts kernels by name): the loss kernels carry
// "cross_entropy" in their names, everything else here is element-wise.
// Each launcher returns cudaGetLastError() (cudaSuccess for empty work). Only CUDA-side sources
// include this header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "models/decoder/decoder_cuda_kernels.hpp"

namespace strata::llm::cuda {

// dst[i] = bf16(src[i]), i < count: a weight or bias cast once per unit call.
cudaError_t round_to_bf16(const float* src, __nv_bfloat16* dst, std::size_t count,
                          cudaStream_t stream);
// dst [rows × cols] (stride ld_dst) = float(src [rows × cols], stride ld_src).
cudaError_t widen_to_fp32(const __nv_bfloat16* src, std::size_t ld_src, float* dst,
                          std::size_t ld_dst, std::size_t rows, std::size_t cols,
                          cudaStream_t stream);

// d[r][c] += bias[c] for rows × cols (stride ld): cublaslt_gemm.cpp's fallback for a product
// whose bias epilogue cuBLASLt has no algorithm for (narrow, unaligned shapes).
cudaError_t add_row_bias(float* d, std::size_t ld, std::size_t rows, std::size_t cols,
                         const float* bias, cudaStream_t stream);
cudaError_t add_row_bias(__nv_bfloat16* d, std::size_t ld, std::size_t rows, std::size_t cols,
                         const __nv_bfloat16* bias, cudaStream_t stream);

// y (bf16) = RMSNorm(x) (bias null) or LayerNorm(x) (bias not null; mean kept) of the fp32
// residual stream x [rows × dim]; mean and rstd fp32 per row, as decoder_cuda_kernels' norms.
cudaError_t norm_forward_bf16(const float* x, const float* weight, const float* bias,
                              __nv_bfloat16* y, float* mean, float* rstd, std::size_t rows,
                              std::size_t dim, float eps, cudaStream_t stream);

// The backward of norm_forward_bf16 on the residual stream's gradient, over fp32 dy (d_norm) and
// the norm's fp32 input x [rows × dim] (mean null: RMSNorm): dx (+)= dL/dx, dx_bf16 = bf16(dx)
// (the copy the next products read, rounded in the same pass), dweight (and dbias, LayerNorm)
// overwritten: rms_norm_backward / layer_norm_backward's formulas (each lane sums its elements in
// fused_norms.cu's order) followed by cast_to_bf16, in one pass over the rows.
// kOverwrite writes dx as if it had been zeroed first (the head's, the first into d_resid).
enum class DxUpdate : std::uint8_t { kOverwrite, kAccumulate };
cudaError_t norm_backward_bf16(const float* dy, const float* x, const float* mean,
                               const float* rstd, const float* weight, float* dx,
                               __nv_bfloat16* dx_bf16, float* dweight, float* dbias,
                               std::size_t rows, std::size_t dim, DxUpdate update,
                               cudaStream_t stream);

// RoPE in place on the first `heads` heads of each bf16 row of x [rows × ld] (q's heads then
// k's: they are adjacent in the q | k | v rows, so one launch rotates both); head h at columns
// h·2·half, row r at position row_positions[r]; cos, sin [positions × half].
cudaError_t rope_forward_bf16(__nv_bfloat16* x, std::size_t ld, std::size_t rows, std::size_t heads,
                              std::size_t half, const std::uint32_t* row_positions,
                              const float* cos, const float* sin, cudaStream_t stream);
// The backward of rope_forward_bf16 over the attention's fp32 d(q | k | v) [rows × cols]
// (stride ld): the first `heads` heads rotated back (the transpose), the rest copied; the result
// both replaces dx (fp32, for the bias gradients) and is rounded into out (bf16, stride ld, the
// operand of the projections' backward products).
cudaError_t rope_backward_to_bf16(float* dx, __nv_bfloat16* out, std::size_t ld, std::size_t rows,
                                  std::size_t cols, std::size_t heads, std::size_t half,
                                  const std::uint32_t* row_positions, const float* cos,
                                  const float* sin, cudaStream_t stream);

// Gated MLP over bf16: h = act(gate)·up of pre [rows × 2·inner] (gate | up).
cudaError_t gated_forward_bf16(ActivationCode act, const __nv_bfloat16* pre, __nv_bfloat16* h,
                               std::size_t rows, std::size_t inner, cudaStream_t stream);
cudaError_t gated_backward_bf16(ActivationCode act, const __nv_bfloat16* dh,
                                const __nv_bfloat16* pre, __nv_bfloat16* dpre, std::size_t rows,
                                std::size_t inner, cudaStream_t stream);
// Plain MLP over bf16: h = act(pre); dpre = dh·act'(pre).
cudaError_t plain_forward_bf16(ActivationCode act, const __nv_bfloat16* pre, __nv_bfloat16* h,
                               std::size_t count, cudaStream_t stream);
cudaError_t plain_backward_bf16(ActivationCode act, const __nv_bfloat16* dh,
                                const __nv_bfloat16* pre, __nv_bfloat16* dpre, std::size_t count,
                                cudaStream_t stream);
// out[c] = Σ over rows, in order, of float(m[r·ld + c]) (a bias gradient from bf16 rows).
cudaError_t column_sums_bf16(const __nv_bfloat16* m, std::size_t ld, std::size_t rows,
                             std::size_t cols, float* out, cudaStream_t stream);

// The loss over one chunk of rows of fp32 logits [rows × vocab] (the LM head's product of that
// chunk): lse[r] = log Σ exp(logits[r]) and row_loss[r] = lse[r] - logits[r][target] (0 for a
// row of weight 0), one block per row.
cudaError_t cross_entropy_forward(const float* logits, const std::int32_t* targets,
                                  const float* weights, float* lse, double* row_loss,
                                  std::size_t rows, std::size_t vocab, cudaStream_t stream);
// dlogits (bf16) = w_r·inv_weight·(exp(logits - lse[r]) - onehot(target)) of the same chunk
// (zeros for rows of weight 0): the operand of the head's backward products.
cudaError_t cross_entropy_backward(const float* logits, const float* lse,
                                   const std::int32_t* targets, const float* weights,
                                   float inv_weight, __nv_bfloat16* dlogits, std::size_t rows,
                                   std::size_t vocab, cudaStream_t stream);

}  // namespace strata::llm::cuda
