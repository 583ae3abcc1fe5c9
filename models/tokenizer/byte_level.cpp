#include "models/tokenizer/byte_level.hpp"

#include "models/tokenizer/utf8.hpp"

namespace strata::llm::detail {
namespace {

bool shown_as_itself(unsigned byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1U && byte <= 0xACU) || (byte >= 0xAEU);
}

}  // namespace

const ByteLevelAlphabet& ByteLevelAlphabet::instance() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_char_.fill(-1);
  char32_t next_shifted = 256;
  for (unsigned byte = 0; byte < 256; ++byte) {
    const char32_t code_point = shown_as_itself(byte) ? byte : next_shifted++;
    append_code_point(char_of_byte_[byte], code_point);
    byte_of_char_[code_point] = static_cast<int>(byte);
  }
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char byte : bytes) out.append(char_of_byte_[static_cast<unsigned char>(byte)]);
  return out;
}

bool ByteLevelAlphabet::decode(std::string_view token, std::string& bytes_out) const {
  std::string bytes;
  for (std::size_t pos = 0; pos < token.size();) {
    const std::size_t length = valid_sequence_bytes(token, pos);
    if (length == 0) return false;
    const char32_t code_point = decode_code_point(token, pos);
    if (code_point >= byte_of_char_.size() || byte_of_char_[code_point] < 0) return false;
    bytes.push_back(static_cast<char>(byte_of_char_[code_point]));
    pos += length;
  }
  bytes_out.append(bytes);
  return true;
}

}  // namespace strata::llm::detail
