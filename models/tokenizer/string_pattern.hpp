// StringPattern: tokenizer.json's `pattern` object, {"String": "..."} (a literal) or
// {"Regex": "..."} (a regular expression, PCRE2 with Unicode properties), used by the Split
// pre-tokenizer and the Replace normalizer and decoder.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "models/tokenizer/json_location.hpp"
#include "models/tokenizer/unicode_regex.hpp"

namespace strata::llm::detail {

UnicodeRegex make_pattern(const JsonLocation& pattern);

// `text` with every match of `pattern` replaced by `content` (left to right, non-overlapping).
std::string replace_all(const UnicodeRegex& pattern, std::string_view text,
                        std::string_view content);

}  // namespace strata::llm::detail
