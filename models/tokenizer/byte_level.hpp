// The byte-level alphabet of GPT-2 style BPE: every byte 0..255 is shown as one printable code
// point (printable Latin-1 bytes as themselves, the rest as U+0100 onwards in byte order), so that
// a vocabulary of strings can hold arbitrary bytes. Encoding maps the UTF-8 bytes of a pre-token to
// these characters before BPE; decoding maps them back.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace strata::llm::detail {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& instance();

  // Each byte of `bytes` replaced by the UTF-8 form of its alphabet character.
  std::string encode(std::string_view bytes) const;
  // The inverse of `encode` on one token: the bytes, or false when some character of `token` is not
  // in the alphabet (added tokens such as "<|eot_id|>" need not be; the caller keeps them as text).
  bool decode(std::string_view token, std::string& bytes_out) const;

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> char_of_byte_;
  std::array<int, 512> byte_of_char_{};  // indexed by code point < 512; -1 when not in the alphabet
};

}  // namespace strata::llm::detail
