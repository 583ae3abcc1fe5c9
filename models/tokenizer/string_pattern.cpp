#include "models/tokenizer/string_pattern.hpp"

#include <stdexcept>

namespace strata::llm::detail {

UnicodeRegex make_pattern(const JsonLocation& pattern) {
  const bool literal = pattern.has("String");
  if (!literal && !pattern.has("Regex"))
    pattern.fail("expected {\"String\": ...} or {\"Regex\": ...}");
  const JsonLocation source = pattern.at(literal ? "String" : "Regex");
  try {
    return UnicodeRegex(source.string(), literal ? PatternSyntax::kLiteral : PatternSyntax::kRegex);
  } catch (const std::invalid_argument& error) {
    source.fail(error.what());
  }
}

std::string replace_all(const UnicodeRegex& pattern, std::string_view text,
                        std::string_view content) {
  std::string out;
  std::size_t copied = 0;
  for (const MatchSpan& match : pattern.find_all(text)) {
    out.append(text.substr(copied, match.begin - copied));
    out.append(content);
    copied = match.end;
  }
  out.append(text.substr(copied));
  return out;
}

}  // namespace strata::llm::detail
