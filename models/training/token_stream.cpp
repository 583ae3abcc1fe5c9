#include "models/training/token_stream.hpp"

#include <algorithm>

#include "base/assert.hpp"

namespace strata::llm {

void TokenStream::append(std::span<const std::int32_t> ids, bool is_trained) {
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  trained.insert(trained.end(), ids.size(), is_trained ? 1 : 0);
}

std::span<const std::int32_t> PackedWindows::window(std::size_t index) const {
  return std::span<const std::int32_t>(tokens).subspan(index * window_tokens, window_tokens);
}

std::span<const float> PackedWindows::window_weights(std::size_t index) const {
  return std::span<const float>(weights).subspan(index * (window_tokens - 1), window_tokens - 1);
}

PackedWindows pack_windows(const TokenStream& stream, std::size_t window_tokens,
                           std::int32_t pad_id) {
  STRATA_ASSERT(window_tokens >= 2);
  PackedWindows packed;
  packed.window_tokens = window_tokens;
  for (std::size_t begin = 0; begin + 2 <= stream.size(); begin += window_tokens) {
    const std::size_t end = std::min(stream.size(), begin + window_tokens);
    for (std::size_t i = begin; i < begin + window_tokens; ++i) {
      packed.tokens.push_back(i < end ? stream.tokens[i] : pad_id);
      if (i == begin) continue;  // the first token of a window is never a target
      packed.weights.push_back(i < end && stream.trained[i] != 0 ? 1.0f : 0.0f);
    }
  }
  return packed;
}

}  // namespace strata::llm
