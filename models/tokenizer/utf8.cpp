#include "models/tokenizer/utf8.hpp"

namespace strata::llm::detail {
namespace {

bool is_continuation(unsigned char byte) {
  return (byte & 0xC0U) == 0x80U;
}

// The allowed range of the second byte after a given lead byte (Unicode Table 3-7): this is what
// excludes overlong forms, surrogates and code points above U+10FFFF.
struct SecondByteRange {
  unsigned char low;
  unsigned char high;
};

SecondByteRange second_byte_range(unsigned char lead) {
  if (lead == 0xE0U) return {0xA0U, 0xBFU};
  if (lead == 0xEDU) return {0x80U, 0x9FU};
  if (lead == 0xF0U) return {0x90U, 0xBFU};
  if (lead == 0xF4U) return {0x80U, 0x8FU};
  return {0x80U, 0xBFU};
}

// Total length a lead byte announces; 0 for bytes that can never start a sequence.
std::size_t announced_length(unsigned char lead) {
  if (lead < 0x80U) return 1;
  if (lead >= 0xC2U && lead <= 0xDFU) return 2;
  if (lead >= 0xE0U && lead <= 0xEFU) return 3;
  if (lead >= 0xF0U && lead <= 0xF4U) return 4;
  return 0;
}

// How many bytes from `pos` belong to a (possibly truncated) well-formed prefix.
std::size_t well_formed_prefix(std::string_view text, std::size_t pos, std::size_t* announced) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  *announced = announced_length(lead);
  if (*announced <= 1) return *announced;
  std::size_t length = 1;
  while (length < *announced && pos + length < text.size()) {
    const auto byte = static_cast<unsigned char>(text[pos + length]);
    if (length == 1) {
      const SecondByteRange range = second_byte_range(lead);
      if (byte < range.low || byte > range.high) break;
    } else if (!is_continuation(byte)) {
      break;
    }
    ++length;
  }
  return length;
}

}  // namespace

std::size_t valid_sequence_bytes(std::string_view text, std::size_t pos) {
  std::size_t announced = 0;
  const std::size_t prefix = well_formed_prefix(text, pos, &announced);
  return prefix == announced ? prefix : 0;
}

std::size_t maximal_subpart_bytes(std::string_view text, std::size_t pos) {
  std::size_t announced = 0;
  const std::size_t prefix = well_formed_prefix(text, pos, &announced);
  return prefix == 0 ? 1 : prefix;
}

bool is_valid_utf8(std::string_view text) {
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t length = valid_sequence_bytes(text, pos);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

std::string repair_utf8(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t length = valid_sequence_bytes(text, pos);
    if (length > 0) {
      out.append(text.substr(pos, length));
      pos += length;
    } else {
      out.append(kReplacementCharacter);
      pos += maximal_subpart_bytes(text, pos);
    }
  }
  return out;
}

char32_t decode_code_point(std::string_view text, std::size_t pos) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  const std::size_t length = announced_length(lead);
  if (length == 1) return lead;
  static constexpr unsigned char kLeadMask[] = {0, 0, 0x1FU, 0x0FU, 0x07U};
  char32_t code_point = lead & kLeadMask[length];
  for (std::size_t i = 1; i < length; ++i) {
    code_point = (code_point << 6U) | (static_cast<unsigned char>(text[pos + i]) & 0x3FU);
  }
  return code_point;
}

void append_code_point(std::string& out, char32_t code_point) {
  if (code_point < 0x80U) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800U) {
    out.push_back(static_cast<char>(0xC0U | (code_point >> 6U)));
    out.push_back(static_cast<char>(0x80U | (code_point & 0x3FU)));
  } else if (code_point < 0x10000U) {
    out.push_back(static_cast<char>(0xE0U | (code_point >> 12U)));
    out.push_back(static_cast<char>(0x80U | ((code_point >> 6U) & 0x3FU)));
    out.push_back(static_cast<char>(0x80U | (code_point & 0x3FU)));
  } else {
    out.push_back(static_cast<char>(0xF0U | (code_point >> 18U)));
    out.push_back(static_cast<char>(0x80U | ((code_point >> 12U) & 0x3FU)));
    out.push_back(static_cast<char>(0x80U | ((code_point >> 6U) & 0x3FU)));
    out.push_back(static_cast<char>(0x80U | (code_point & 0x3FU)));
  }
}

}  // namespace strata::llm::detail
