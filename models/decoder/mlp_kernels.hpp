// The MLP's element-wise parts on host fp32 arrays, forward and backward.
//   gated (Llama, Mistral, Qwen2): h = act(gate)·up, gate|up side by side in one row of 2·inner
//   plain (GPT-2):                 h = act(fc)
// act is silu (x·σ(x)), gelu with the tanh approximation (GPT-2's gelu_new) or the exact erf
// gelu. Backward recomputes act from the kept pre-activations.
#pragma once

#include <cstddef>

#include "models/decoder/hf_config.hpp"

namespace strata::llm::detail {

// pre [rows × 2·inner] (gate | up) -> h [rows × inner].
void gated_forward(Activation act, const float* pre, float* h, std::size_t rows,
                   std::size_t inner);
// dh [rows × inner] -> dpre [rows × 2·inner] (dgate | dup), overwritten.
void gated_backward(Activation act, const float* dh, const float* pre, float* dpre,
                    std::size_t rows, std::size_t inner);

// h = act(pre), count elements.
void plain_forward(Activation act, const float* pre, float* h, std::size_t count);
// dpre = dh·act'(pre); dpre may alias dh.
void plain_backward(Activation act, const float* dh, const float* pre, float* dpre,
                    std::size_t count);

}  // namespace strata::llm::detail
