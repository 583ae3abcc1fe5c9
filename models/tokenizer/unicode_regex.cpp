#include "models/tokenizer/unicode_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>

#include "models/tokenizer/utf8.hpp"

namespace strata::llm::detail {
namespace {

pcre2_code* as_code(void* code) {
  return static_cast<pcre2_code*>(code);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const noexcept { pcre2_match_data_free(data); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

std::string pcre2_message(int error_code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(error_code, buffer.data(), buffer.size());
  return std::string(reinterpret_cast<const char*>(buffer.data()));
}

}  // namespace

UnicodeRegex::UnicodeRegex(std::string_view pattern, PatternSyntax syntax) {
  // PCRE2_LITERAL admits no UCP (a literal has no classes for it to change).
  const std::uint32_t options =
      syntax == PatternSyntax::kLiteral ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    throw std::invalid_argument("regex does not compile at offset " + std::to_string(error_offset) +
                                ": " + pcre2_message(error_code));
  }
  // JIT only speeds matching up; where the platform lacks it, the interpreter gives the same
  // matches.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

UnicodeRegex::~UnicodeRegex() {
  release();
}

UnicodeRegex::UnicodeRegex(UnicodeRegex&& other) noexcept
    : code_(std::exchange(other.code_, nullptr)) {}

UnicodeRegex& UnicodeRegex::operator=(UnicodeRegex&& other) noexcept {
  if (this != &other) {
    release();
    code_ = std::exchange(other.code_, nullptr);
  }
  return *this;
}

void UnicodeRegex::release() noexcept {
  if (code_ != nullptr) pcre2_code_free(as_code(code_));
  code_ = nullptr;
}

std::vector<MatchSpan> UnicodeRegex::find_all(std::string_view subject) const {
  std::vector<MatchSpan> matches;
  const MatchData match_data(pcre2_match_data_create_from_pattern(as_code(code_), nullptr));
  if (!match_data) throw std::bad_alloc();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  std::size_t start = 0;
  while (start <= subject.size()) {
    // The subject was validated (repair_utf8) before it reached any regex.
    const int rc = pcre2_match(as_code(code_), data, subject.size(), start, PCRE2_NO_UTF_CHECK,
                               match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    const MatchSpan span{ovector[0], ovector[1]};
    if (span.end > span.begin) {
      matches.push_back(span);
      start = span.end;
    } else {
      // An empty match: step over one character so the scan always advances.
      if (start == subject.size()) break;
      const std::size_t length = valid_sequence_bytes(subject, start);
      start += length == 0 ? 1 : length;
    }
  }
  return matches;
}

}  // namespace strata::llm::detail
