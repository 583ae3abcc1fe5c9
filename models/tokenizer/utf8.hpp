// UTF-8 helpers of the tokenizer: repairing invalid input the way the Hugging Face pipeline sees
// it, and walking code points. Text reaching the Hugging Face tokenizers library is always valid
// UTF-8 (a Rust String, decoded by Python or JavaScript with U+FFFD replacement first), so strata
// repairs invalid bytes the same way before tokenizing: each maximal subpart of an ill-formed
// sequence becomes one U+FFFD (Unicode's "substitution of maximal subparts", what Python's
// errors="replace", JavaScript's TextDecoder and Rust's from_utf8_lossy all do).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::llm::detail {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Length in bytes of the well-formed UTF-8 sequence starting at text[pos], or 0 when the bytes
// there are not one (then `maximal_subpart_bytes` says how many bytes one U+FFFD replaces).
std::size_t valid_sequence_bytes(std::string_view text, std::size_t pos);
std::size_t maximal_subpart_bytes(std::string_view text, std::size_t pos);

bool is_valid_utf8(std::string_view text);

// `text` with every ill-formed subsequence replaced by U+FFFD; valid text is returned unchanged.
std::string repair_utf8(std::string_view text);

// The code point of the valid sequence at text[pos].
// Contract: valid_sequence_bytes(text, pos) > 0.
char32_t decode_code_point(std::string_view text, std::size_t pos);
void append_code_point(std::string& out, char32_t code_point);

}  // namespace strata::llm::detail
