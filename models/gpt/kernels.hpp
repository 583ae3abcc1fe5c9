// The GPT's arithmetic on host fp32 arrays: matrix products through OpenBLAS, LayerNorm, GELU,
// causal attention and the cross-entropy loss, forward and backward. Row-major throughout;
// `rows` is batch × sequence. Every function is deterministic for a fixed OpenBLAS thread count:
// element-wise work is split by rows, and every sum over rows runs in one fixed order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace strata::gpt::detail {

enum class Transpose { kNo, kYes };

// C[m×n] = alpha·op(A)·op(B) + beta·C, op(A) is m×k, op(B) is k×n. lda/ldb/ldc: row strides.
void gemm(Transpose trans_a, Transpose trans_b, std::size_t m, std::size_t n, std::size_t k,
          float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
          float* c, std::size_t ldc);

// out[rows×out_dim] = x[rows×in_dim]·w[in_dim×out_dim] + bias.
void linear_forward(const float* x, const float* w, const float* bias, float* out, std::size_t rows,
                    std::size_t in_dim, std::size_t out_dim);
// dx (+)= dout·wᵀ (accumulate: adds into dx), dw = xᵀ·dout, dbias = Σ_rows dout.
enum class Accumulate { kNo, kYes };
void linear_backward(const float* dout, const float* x, const float* w, float* dx, float* dw,
                     float* dbias, std::size_t rows, std::size_t in_dim, std::size_t out_dim,
                     Accumulate accumulate_dx);

// out = (x - mean)·rstd·weight + bias per row; keeps mean and rstd (one per row) for backward.
void layernorm_forward(const float* x, const float* weight, const float* bias, float* out,
                       float* mean, float* rstd, std::size_t rows, std::size_t dim);
// dx += LayerNorm's input gradient; dweight, dbias = their gradients (overwritten).
void layernorm_backward(const float* dout, const float* x, const float* mean, const float* rstd,
                        const float* weight, float* dx, float* dweight, float* dbias,
                        std::size_t rows, std::size_t dim);

// GELU, tanh approximation. Forward keeps tanh(·) of each element for backward.
void gelu_forward(const float* x, float* out, float* tanh_out, std::size_t count);
void gelu_backward(const float* dout, const float* x, const float* tanh_in, float* dx,
                   std::size_t count);

struct AttentionShape {
  std::size_t batch;
  std::size_t seq;
  std::size_t heads;
  std::size_t dim;  // model width; head width = dim / heads
};
// qkv [batch·seq × 3·dim] (q | k | v, heads side by side in each) -> out [batch·seq × dim];
// prob [batch × heads × seq × seq] keeps the causal softmax (zeros above the diagonal).
void attention_forward(const AttentionShape& shape, const float* qkv, float* prob, float* out);
// dqkv (overwritten) from dout; scratch holds seq × seq floats per concurrent (batch, head).
void attention_backward(const AttentionShape& shape, const float* dout, const float* qkv,
                        const float* prob, float* dqkv, float* scratch);
std::size_t attention_scratch_floats(const AttentionShape& shape);

// Mean over rows of -log softmax(logits)[target]; writes dlogits = (softmax - onehot) / rows.
double cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                     std::size_t rows, std::size_t vocab);

}  // namespace strata::gpt::detail
