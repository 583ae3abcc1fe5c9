// UnicodeRegex: one compiled PCRE2 pattern with UTF and UCP on, so \s, \w, \d and \p{L} / \p{N}
// follow Unicode properties as the Oniguruma patterns of Hugging Face tokenizers expect. Move-only;
// owns the compiled code. find_all may run on several threads at once (each call has its own
// match data).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata::llm::detail {

struct MatchSpan {
  std::size_t begin = 0;  // byte offsets into the subject
  std::size_t end = 0;
};

enum class PatternSyntax { kRegex, kLiteral };

class UnicodeRegex {
 public:
  // Throws std::invalid_argument with PCRE2's message and offset when the pattern does not compile.
  UnicodeRegex(std::string_view pattern, PatternSyntax syntax);
  ~UnicodeRegex();
  UnicodeRegex(UnicodeRegex&& other) noexcept;
  UnicodeRegex& operator=(UnicodeRegex&& other) noexcept;
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // Every non-overlapping, non-empty match, left to right. Contract: `subject` is valid UTF-8.
  std::vector<MatchSpan> find_all(std::string_view subject) const;

 private:
  void release() noexcept;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace strata::llm::detail
