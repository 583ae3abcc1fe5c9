// The GPT's elementwise and row-wise work on a CUDA stream (cuda_kernels.cu): what kernels.cpp does
// on the host besides the matrix products, over device pointers. The per-element and per-row
// arithmetic is gpt_math.hpp's, shared with the host. Row-wise work runs one warp per row (fixed
// butterfly reductions); every sum over rows runs in a fixed order (cuda_kernels.cu).
// No atomics anywhere: results are bitwise reproducible run to run. Each launcher returns
// cudaGetLastError() (cudaSuccess for empty work). Only CUDA-side sources include this header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::gpt::cuda {

// x[row] = wte[inputs[row]] + wpe[row % seq], rows × d.
cudaError_t embedding_forward(const std::int32_t* inputs, const float* wte, const float* wpe,
                              float* x, std::size_t rows, std::size_t seq, std::size_t d,
                              cudaStream_t stream);
// dwte[v] = tied_share[v] (or 0 when null) + Σ dx[row] over the rows holding token v, in row
// order: token_offsets [vocab + 1] and token_rows [rows] list them (a stable counting sort of the
// inputs). dwpe[t] = Σ over sequences s, in order, of dx[s·seq + t].
cudaError_t embedding_backward(const float* dx, const std::int32_t* token_offsets,
                               const std::int32_t* token_rows, const float* tied_share, float* dwte,
                               float* dwpe, std::size_t sequences, std::size_t seq,
                               std::size_t vocab, std::size_t d, cudaStream_t stream);

// out[r][c] = bias[c]: seeds a linear layer's output before its product with beta = 1.
cudaError_t broadcast_rows(const float* bias, float* out, std::size_t rows, std::size_t cols,
                           cudaStream_t stream);
// out[c] = Σ over rows of m[r][c], in a fixed order.
cudaError_t column_sums(const float* m, std::size_t rows, std::size_t cols, float* out,
                        cudaStream_t stream);
// out[i] += x[i].
cudaError_t add_in_place(float* out, const float* x, std::size_t count, cudaStream_t stream);

cudaError_t layernorm_forward(const float* x, const float* weight, const float* bias, float* out,
                              float* mean, float* rstd, std::size_t rows, std::size_t dim,
                              cudaStream_t stream);
// dx += input gradient; dweight, dbias overwritten.
cudaError_t layernorm_backward(const float* dout, const float* x, const float* mean,
                               const float* rstd, const float* weight, float* dx, float* dweight,
                               float* dbias, std::size_t rows, std::size_t dim,
                               cudaStream_t stream);

cudaError_t gelu_forward(const float* x, float* out, float* tanh_out, std::size_t count,
                         cudaStream_t stream);
// dx = dout·GELU'(x); dx may be dout.
cudaError_t gelu_backward(const float* dout, const float* x, const float* tanh_in, float* dx,
                          std::size_t count, cudaStream_t stream);

// Causal softmax in place over `matrices` score matrices of seq × seq.
cudaError_t causal_softmax_forward(float* scores, std::size_t matrices, std::size_t seq,
                                   cudaStream_t stream);
// ds holds dP on entry, dS on exit.
cudaError_t causal_softmax_backward(const float* prob, float* ds, std::size_t matrices,
                                    std::size_t seq, cudaStream_t stream);

// Per row: row_loss[r] = -log softmax(logits[r])[targets[r]], dlogits[r] = (softmax - onehot)/rows.
cudaError_t cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                          double* row_loss, std::size_t rows, std::size_t vocab,
                          cudaStream_t stream);

}  // namespace strata::gpt::cuda
