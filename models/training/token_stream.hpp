// TokenStream: training examples tokenized and concatenated, each token marked trained (its
// prediction counts in the loss) or not; and its packing into fixed windows of seq_len + 1
// tokens (inputs plus the shifted targets), the unit batches are drawn from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace strata::llm {

struct TokenStream {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> trained;  // one per token: 1 when predicting it counts in the loss

  void append(std::span<const std::int32_t> ids, bool is_trained);
  std::size_t size() const { return tokens.size(); }
};

// Windows of `window_tokens` consecutive tokens, back to back from token 0 (no overlap). A last
// partial window of at least 2 tokens is kept, padded with `pad_id` at weight 0.
struct PackedWindows {
  std::size_t window_tokens = 0;
  std::vector<std::int32_t> tokens;  // windows × window_tokens
  std::vector<float> weights;        // windows × (window_tokens - 1): weight of target j + 1

  std::size_t count() const { return window_tokens == 0 ? 0 : tokens.size() / window_tokens; }
  std::span<const std::int32_t> window(std::size_t index) const;
  std::span<const float> window_weights(std::size_t index) const;
};

PackedWindows pack_windows(const TokenStream& stream, std::size_t window_tokens,
                           std::int32_t pad_id);

}  // namespace strata::llm
