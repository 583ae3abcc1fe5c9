// Where each tensor sits in a unit of decoder_units(): indices into UnitSpec::tensors, looked up
// once by name so the model's arithmetic never depends on the order a family lists them in.
// kAbsent marks a tensor the family does not have (Llama's q_proj.bias, GPT-2's gate_proj).
#pragma once

#include <cstddef>
#include <limits>
#include <string_view>

#include "models/decoder/decoder_model.hpp"

namespace strata::llm::detail {

inline constexpr std::size_t kAbsent = std::numeric_limits<std::size_t>::max();

// Index of the tensor called `name` in `unit`, or kAbsent.
std::size_t tensor_index(const UnitSpec& unit, std::string_view name);

struct LayerLayout {
  std::size_t norm1_weight = kAbsent, norm1_bias = kAbsent;
  // Llama family: separate projections in HF [out, in] layout.
  std::size_t q_weight = kAbsent, q_bias = kAbsent, k_weight = kAbsent, k_bias = kAbsent;
  std::size_t v_weight = kAbsent, v_bias = kAbsent, o_weight = kAbsent;
  // GPT-2: fused c_attn and c_proj in Conv1D [in, out] layout.
  std::size_t qkv_weight = kAbsent, qkv_bias = kAbsent, out_weight = kAbsent, out_bias = kAbsent;
  std::size_t norm2_weight = kAbsent, norm2_bias = kAbsent;
  std::size_t gate_weight = kAbsent, up_weight = kAbsent, down_weight = kAbsent;  // SwiGLU
  std::size_t fc_weight = kAbsent, fc_bias = kAbsent, proj_weight = kAbsent, proj_bias = kAbsent;
};
LayerLayout layer_layout(const UnitSpec& layer_unit);

struct HeadLayout {
  std::size_t norm_weight = kAbsent, norm_bias = kAbsent, lm_head = kAbsent;
};
HeadLayout head_layout(const UnitSpec& head_unit);

// Embedding unit: token embedding first, GPT-2's position embedding second.
inline constexpr std::size_t kTokenEmbedding = 0;
inline constexpr std::size_t kPositionEmbedding = 1;

}  // namespace strata::llm::detail
