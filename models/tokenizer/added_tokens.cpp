#include "models/tokenizer/added_tokens.hpp"

#include <unicode/uchar.h>

#include <algorithm>

#include "models/tokenizer/utf8.hpp"

namespace strata::llm::detail {
namespace {

// Unicode White_Space (what Rust's char::is_whitespace tests), from ICU's property data.
bool is_whitespace(char32_t code_point) {
  return u_isUWhiteSpace(static_cast<UChar32>(code_point));
}

// Start of the run of whitespace characters that ends at `end` (not before `floor`).
std::size_t whitespace_run_before(std::string_view text, std::size_t floor, std::size_t end) {
  std::size_t begin = end;
  while (begin > floor) {
    std::size_t previous = begin - 1;
    while (previous > floor && (static_cast<unsigned char>(text[previous]) & 0xC0U) == 0x80U) {
      --previous;
    }
    if (!is_whitespace(decode_code_point(text, previous))) break;
    begin = previous;
  }
  return begin;
}

std::size_t whitespace_run_after(std::string_view text, std::size_t begin) {
  std::size_t end = begin;
  while (end < text.size() && is_whitespace(decode_code_point(text, end))) {
    end += valid_sequence_bytes(text, end);
  }
  return end;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;  // matches nothing, as in the library
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& candidates : by_first_byte_) {
    // Longest first; among equal lengths the earlier token, so the choice is deterministic.
    std::stable_sort(candidates.begin(), candidates.end(), [this](std::size_t a, std::size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

const AddedToken* AddedTokenMatcher::longest_at(std::string_view text, std::size_t pos) const {
  for (const std::size_t index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    if (text.substr(pos).starts_with(tokens_[index].content)) return &tokens_[index];
  }
  return nullptr;
}

AddedTokenMatcher::Match AddedTokenMatcher::widen(std::string_view text, std::size_t floor,
                                                  Match match) const {
  if (match.token->lstrip) match.begin = whitespace_run_before(text, floor, match.begin);
  if (match.token->rstrip) match.end = whitespace_run_after(text, match.end);
  return match;
}

void AddedTokenMatcher::split_one(TextPiece piece, TextPieces& out) const {
  const std::string_view text = piece.text;
  std::size_t emitted = 0;  // text before this offset is already in `out`
  auto emit_text = [&](std::size_t begin, std::size_t end) {
    if (end > begin) {
      out.push_back(TextPiece{std::string(text.substr(begin, end - begin)), std::nullopt,
                              piece.at_text_start && begin == 0});
    }
  };
  for (std::size_t pos = 0; pos < text.size();) {
    const AddedToken* token = longest_at(text, pos);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    const Match match = widen(text, emitted, Match{pos, pos + token->content.size(), token});
    emit_text(emitted, match.begin);
    out.push_back(TextPiece{token->content, token->id, false});
    emitted = match.end;
    pos = match.end;
  }
  emit_text(emitted, text.size());
}

void AddedTokenMatcher::split(TextPieces& pieces) const {
  if (tokens_.empty()) return;
  TextPieces out;
  for (TextPiece& piece : pieces) {
    if (piece.added_token_id) {
      out.push_back(std::move(piece));
    } else {
      split_one(std::move(piece), out);
    }
  }
  pieces = std::move(out);
}

}  // namespace strata::llm::detail
