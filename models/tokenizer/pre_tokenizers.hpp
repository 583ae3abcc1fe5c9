// Pre-tokenizers of tokenizer.json: Split (a regex or literal with any of the five delimiter
// behaviours, optionally inverted), ByteLevel (GPT-2's regex when use_regex, a leading space when
// add_prefix_space, then the byte-level alphabet), Metaspace (spaces to "▁", prepend scheme, split)
// and Sequence of these. Others are refused by name.
#pragma once

#include <memory>

#include "models/tokenizer/json_location.hpp"
#include "models/tokenizer/text_piece.hpp"

namespace strata::llm::detail {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece without an added-token id into smaller pieces (empty ones are dropped), in
  // order; added-token pieces pass through unchanged.
  virtual void pre_tokenize(TextPieces& pieces) const = 0;
};

// Null when the JSON value is null (the whole normalized text is one word).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonLocation& spec);

}  // namespace strata::llm::detail
