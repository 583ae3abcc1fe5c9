// Added tokens of tokenizer.json ("added_tokens"): strings such as "<|eot_id|>" that become one id
// wherever they occur in the text, before the text is normalized or pre-tokenized. As in the
// library, matching is leftmost-longest (at the first position where any token starts, the longest
// token wins); tokens with normalized=false are found in the raw text, those with normalized=true
// in the normalized text; lstrip / rstrip also swallow the whitespace beside a match.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/tokenizer/text_piece.hpp"

namespace strata::llm::detail {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;     // dropped by decode(skip_special_tokens=true)
  bool normalized = false;  // matched after normalization
  bool lstrip = false;
  bool rstrip = false;
};

// Finds one group of added tokens in text.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  // Splits each text piece (not yet an added token) around the matches: matched tokens become
  // pieces with their id. Empty text pieces are dropped.
  void split(TextPieces& pieces) const;

 private:
  struct Match {
    std::size_t begin;
    std::size_t end;
    const AddedToken* token;
  };
  const AddedToken* longest_at(std::string_view text, std::size_t pos) const;
  Match widen(std::string_view text, std::size_t floor, Match match) const;
  void split_one(TextPiece piece, TextPieces& out) const;

  std::vector<AddedToken> tokens_;
  // Indices into tokens_ by first byte, longest first: the candidates at a position.
  std::array<std::vector<std::size_t>, 256> by_first_byte_;
};

}  // namespace strata::llm::detail
