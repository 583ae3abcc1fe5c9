#include "io/io_error.hpp"

#include <cstring>

namespace strata::io {

namespace {

std::string describe(std::string_view operation, std::string_view path, std::uint64_t offset_bytes,
                     std::uint64_t length_bytes, int error_number, std::string_view hint) {
  std::string text;
  text.append(operation);
  if (!path.empty()) {
    text.append(" of '").append(path).append("'");
  }
  if (length_bytes > 0) {
    text.append(" at offset ")
        .append(std::to_string(offset_bytes))
        .append(", length ")
        .append(std::to_string(length_bytes));
  }
  text.append(" failed: ").append(std::generic_category().message(error_number));
  if (!hint.empty()) {
    text.append(" (").append(hint).append(")");
  }
  return text;
}

}  // namespace

IoError::IoError(std::string_view operation, std::string_view path, std::uint64_t offset_bytes,
                 std::uint64_t length_bytes, int error_number, std::string_view hint)
    : std::system_error(error_number, std::generic_category(), std::string(operation)),
      operation_(operation),
      path_(path),
      offset_bytes_(offset_bytes),
      length_bytes_(length_bytes),
      message_(describe(operation, path, offset_bytes, length_bytes, error_number, hint)) {}

}  // namespace strata::io
