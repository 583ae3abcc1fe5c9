// Rotary position embeddings in Hugging Face's rotate-half layout (modeling_llama.py):
//   x' = x·cos + rotate_half(x)·sin, rotate_half([x1, x2]) = [-x2, x1], halves of head_dim,
// with cos/sin of position·inv_freq, inv_freq_i = 1 / theta^(2i / head_dim), and Llama 3.1's
// "llama3" rescaling of inv_freq (transformers' _compute_llama3_parameters). The angle is
// formed in fp32 as transformers does (fp32 inv_freq times fp32 position), so long positions
// round as they did when the model was trained.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/decoder/hf_config.hpp"

namespace strata::llm::detail {

// inv_freq of `config` (head_dim / 2 values), llama3 scaling applied.
std::vector<float> rope_inverse_frequencies(const HfConfig& config);

class RopeTable {
 public:
  RopeTable() = default;
  // cos/sin for positions [0, positions).
  RopeTable(const HfConfig& config, std::size_t positions);

  std::size_t positions() const { return positions_; }
  // The tables, [positions × head_dim / 2] each (the CUDA decoder uploads them).
  const std::vector<float>& cos() const { return cos_; }
  const std::vector<float>& sin() const { return sin_; }

  enum class Direction : unsigned char { kForward, kInverse };
  // Rotates `heads` heads of each row of x [rows × ld] in place (head h at columns h·head_dim).
  // Row r sits at position first_position + r % rows_per_sequence, or row_positions[r] when
  // given (packed documents restart their positions). kInverse applies the transpose rotation:
  // the backward of kForward.
  void rotate(float* x, std::size_t ld, std::size_t rows, std::size_t heads,
              std::size_t rows_per_sequence, std::size_t first_position, Direction direction,
              const std::uint32_t* row_positions = nullptr) const;

 private:
  std::size_t half_ = 0;  // head_dim / 2
  std::size_t positions_ = 0;
  std::vector<float> cos_, sin_;  // [positions × half]
};

}  // namespace strata::llm::detail
