// The launchers behind flash_attention.hpp (private to flash_attention*.cu / .cpp): the problem as
// the kernels take it and one launcher per kernel family. Host-safe: flash_attention.cpp checks
// the arguments and calls these; the kernels live in flash_attention_forward.cu and
// flash_attention_backward.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "models/decoder/flash_attention.hpp"

namespace strata::llm::cuda::flash {

// AttentionDims, checked and narrowed to the kernels' int arithmetic (positions < 2^30).
struct Problem {
  int sequences, positions, heads, kv_heads;
  int group;                       // heads / kv_heads: query head h reads kv head h / group
  int head_dim;                    // a multiple of 8, at most 128
  int window;                      // 0: none (also when the window reaches past every position)
  const std::uint32_t* first_key;  // null: no packed documents
  float scale;                     // 1 / sqrt(head_dim)
  float scale_log2;                // scale · log2(e): the kernels' exponentials are exp2
};

struct ForwardArgs {
  Problem problem;
  Bf16Rows q, k, v;
  FloatRows out;  // written when out_bf16.data is null
  float* lse;
  Bf16MutRows out_bf16{nullptr, 0};  // written instead of out when not null
};

struct BackwardArgs {
  Problem problem;
  Bf16Rows q, k, v, dout;
  const float* lse;
  const float* delta;
  FloatRows dq, dk, dv;
};

// Dynamic shared memory per block of the forward and of the largest backward kernel.
std::size_t forward_shared_bytes(int head_dim);
std::size_t backward_shared_bytes(int head_dim);

cudaError_t launch_forward(const ForwardArgs& args, cudaStream_t stream);
// delta[(b·heads + h)·positions + i] = Σ_c dout[row][h·head_dim + c]·out[row][...], fp32 sums.
cudaError_t launch_delta(const Problem& problem, const float* dout, std::size_t ld_dout,
                         const float* out, std::size_t ld_out, float* delta, cudaStream_t stream);
cudaError_t launch_delta(const Problem& problem, const __nv_bfloat16* dout, std::size_t ld_dout,
                         const __nv_bfloat16* out, std::size_t ld_out, float* delta,
                         cudaStream_t stream);
// dq, then dk and dv, from args.delta (launch_delta first).
cudaError_t launch_gradients(const BackwardArgs& args, cudaStream_t stream);

}  // namespace strata::llm::cuda::flash
