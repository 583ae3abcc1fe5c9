// The decoder's normalisations on host fp32 rows [rows × dim], forward and backward.
//   RMSNorm (Llama, Mistral, Qwen2; HF's LlamaRMSNorm in fp32): y = x·rsqrt(mean(x²) + eps)·w
//   LayerNorm (GPT-2):                                          y = (x - mean)·rstd·w + b
// Forward keeps one rstd (and, for LayerNorm, one mean) per row for backward. Backward adds the
// input gradient into dx and overwrites the parameter gradients, summing rows in order on one
// thread, so the bits never depend on the thread count.
#pragma once

#include <cstddef>

namespace strata::llm::detail {

struct NormShape {
  std::size_t rows;
  std::size_t dim;
  float eps;
};

void rms_norm_forward(const NormShape& shape, const float* x, const float* weight, float* y,
                      float* rstd);
void rms_norm_backward(const NormShape& shape, const float* dy, const float* x, const float* rstd,
                       const float* weight, float* dx, float* dweight);

void layer_norm_forward(const NormShape& shape, const float* x, const float* weight,
                        const float* bias, float* y, float* mean, float* rstd);
void layer_norm_backward(const NormShape& shape, const float* dy, const float* x,
                         const float* mean, const float* rstd, const float* weight, float* dx,
                         float* dweight, float* dbias);

}  // namespace strata::llm::detail
