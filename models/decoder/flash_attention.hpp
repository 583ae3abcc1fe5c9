// Causal self-attention on the tensor cores (flash_attention*.cu): FlashAttention-2's forward and
// backward with bf16 operands, fp32 accumulation and an fp32 online softmax, over the same
// AttentionDims as decoder_cuda_kernels' fp32 kernel (causal, GQA, Mistral's sliding window,
// packed documents through first_key). See [Note: flash attention tiles] in
// flash_attention_kernels.cuh for the tiling.
//
// Two interfaces:
//   - bf16: q, k, v (and dout, out for the backward) are bf16 rows with a stride; the forward's
//     out is fp32 or bf16, lse, dq, dk, dv are fp32. Inputs need 16-byte aligned base pointers
//     and strides that are multiples of 8 elements (16 bytes).
//   - fp32: the decoder's fp32 activations (the arguments of decoder_cuda_kernels'
//     attention_forward / attention_backward): q, k, v (and dout) are rounded to bf16 (nearest
//     even) into `scratch`, then the bf16 kernels run; delta = rowsum(dout ∘ out) is taken from
//     the fp32 values.
// The log-sum-exp kept per (sequence, head, query) is the natural-log one the fp32 kernel keeps;
// the backward recomputes the probabilities from q, k and it, so lse must come from this forward
// on the same (rounded) q and k.
//
// Supported: head_dim a multiple of 8 up to kMaxAttentionHeadDim (128), heads a multiple of
// kv_heads; first_key may be null (no packed documents). Anything else returns
// cudaErrorInvalidValue; flash_attention_supported() tells beforehand.
// Determinism: no atomics. dq is one block per query tile walking the key tiles in order; dk, dv
// one block per key tile walking the group's heads in head order and the query tiles in order.
// The same inputs give the same bits run to run on one GPU.
// Threading: launches on `stream` only; every call returns cudaGetLastError() (cudaSuccess for
// empty work). Only CUDA-side sources include this header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "models/decoder/decoder_cuda_kernels.hpp"

namespace strata::llm::cuda {

// Rows of a matrix on the device: row r starts at data + r·ld (elements).
struct Bf16Rows {
  const __nv_bfloat16* data;
  std::size_t ld;
};
struct FloatRows {
  float* data;
  std::size_t ld;
};
struct Bf16MutRows {
  __nv_bfloat16* data;
  std::size_t ld;
};

// Whether the tensor-core kernels take this head_dim on `device` (its opt-in shared memory per
// block must hold the tiles: 104 KiB at head_dim 128, as on sm_80 and sm_90 parts).
bool flash_attention_supported(std::size_t head_dim, int device);

// --- bf16 interface ----------------------------------------------------------------------------
// q: rows of sequence b start at b·positions, head h at column h·head_dim; k, v: kv head g at
// column g·head_dim. out likewise (fp32), lse [sequences × heads × positions].
cudaError_t flash_attention_forward(const AttentionDims& dims, Bf16Rows q, Bf16Rows k, Bf16Rows v,
                                    FloatRows out, float* lse, cudaStream_t stream);
// The same with out rounded to bf16 (nearest even) as it is stored: bit for bit the rounding of
// the fp32 overload's out (the bf16 decoder stores its attention output so, with no fp32 copy).
// out's base 4-byte aligned and ld even (columns are stored in pairs).
cudaError_t flash_attention_forward(const AttentionDims& dims, Bf16Rows q, Bf16Rows k, Bf16Rows v,
                                    Bf16MutRows out, float* lse, cudaStream_t stream);
// dq, dk, dv overwritten (dk, dv sum the group's heads in head order); delta: lse's size of
// scratch (rowsum(dout ∘ out), computed here from the bf16 values).
cudaError_t flash_attention_backward(const AttentionDims& dims, Bf16Rows dout, Bf16Rows out,
                                     Bf16Rows q, Bf16Rows k, Bf16Rows v, const float* lse,
                                     float* delta, FloatRows dq, FloatRows dk, FloatRows dv,
                                     cudaStream_t stream);

// --- fp32 interface (decoder_cuda_kernels' attention_forward / attention_backward) --------------
// bf16 elements of `scratch` the fp32 interface needs: q, k, v and dout of every row, packed.
std::size_t flash_attention_scratch_elements(const AttentionDims& dims);
cudaError_t flash_attention_forward(const AttentionDims& dims, const float* q, const float* k,
                                    const float* v, std::size_t ld_qkv, float* out,
                                    std::size_t ld_out, float* lse, __nv_bfloat16* scratch,
                                    cudaStream_t stream);
cudaError_t flash_attention_backward(const AttentionDims& dims, const float* dout,
                                     std::size_t ld_out, const float* out, const float* q,
                                     const float* k, const float* v, std::size_t ld_qkv,
                                     const float* lse, float* delta, float* dq, float* dk,
                                     float* dv, __nv_bfloat16* scratch, cudaStream_t stream);

}  // namespace strata::llm::cuda
