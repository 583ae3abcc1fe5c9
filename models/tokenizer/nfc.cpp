#include "models/tokenizer/nfc.hpp"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <limits>
#include <stdexcept>
#include <vector>

namespace strata::llm::detail {
namespace {

void check(UErrorCode status, const char* operation) {
  if (U_FAILURE(status)) {
    throw std::runtime_error(std::string("NFC normalization: ") + operation +
                             " failed: " + u_errorName(status));
  }
}

std::vector<UChar> to_utf16(std::string_view text) {
  if (text.size() > static_cast<std::size_t>(std::numeric_limits<int32_t>::max() / 2)) {
    throw std::length_error("NFC normalization: text of " + std::to_string(text.size()) +
                            " bytes is larger than ICU handles in one call");
  }
  UErrorCode status = U_ZERO_ERROR;
  // A UTF-8 string never needs more UTF-16 units than it has bytes.
  std::vector<UChar> utf16(text.size() + 1);
  int32_t length = 0;
  u_strFromUTF8(utf16.data(), static_cast<int32_t>(utf16.size()), &length, text.data(),
                static_cast<int32_t>(text.size()), &status);
  check(status, "UTF-8 to UTF-16");
  utf16.resize(static_cast<std::size_t>(length));
  return utf16;
}

std::string to_utf8(const std::vector<UChar>& utf16) {
  UErrorCode status = U_ZERO_ERROR;
  std::string utf8(utf16.size() * 3 + 1, '\0');  // at most 3 bytes per UTF-16 unit
  int32_t length = 0;
  u_strToUTF8(utf8.data(), static_cast<int32_t>(utf8.size()), &length, utf16.data(),
              static_cast<int32_t>(utf16.size()), &status);
  check(status, "UTF-16 to UTF-8");
  utf8.resize(static_cast<std::size_t>(length));
  return utf8;
}

}  // namespace

std::string to_nfc(std::string_view text) {
  if (text.empty()) return {};
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&status);
  check(status, "unorm2_getNFCInstance");
  const std::vector<UChar> source = to_utf16(text);
  const auto source_length = static_cast<int32_t>(source.size());
  if (unorm2_isNormalized(nfc, source.data(), source_length, &status) != 0) {
    check(status, "unorm2_isNormalized");
    return std::string(text);
  }
  // Composition never lengthens much; ask ICU for the exact size when the first guess is short.
  std::vector<UChar> normalized(source.size() * 2 + 16);
  status = U_ZERO_ERROR;
  int32_t length = unorm2_normalize(nfc, source.data(), source_length, normalized.data(),
                                    static_cast<int32_t>(normalized.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    normalized.resize(static_cast<std::size_t>(length));
    status = U_ZERO_ERROR;
    length =
        unorm2_normalize(nfc, source.data(), source_length, normalized.data(), length, &status);
  }
  check(status, "unorm2_normalize");
  normalized.resize(static_cast<std::size_t>(length));
  return to_utf8(normalized);
}

}  // namespace strata::llm::detail
