// TextPiece: one piece of the text on its way through the tokenizer.json pipeline. Added tokens
// found in the text are pieces that already carry their id and skip normalization, pre-tokenization
// and the model; the rest is split further by each pre-tokenizer and encoded word by word.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::llm::detail {

struct TextPiece {
  std::string text;
  std::optional<std::int32_t> added_token_id;
  // The piece begins at byte 0 of the caller's text (Metaspace's prepend_scheme "first" asks this).
  bool at_text_start = false;
};

using TextPieces = std::vector<TextPiece>;

}  // namespace strata::llm::detail
