// Decoders of tokenizer.json, each a step from a list of token strings to a list of strings as in
// the library's decode_chain: ByteLevel (alphabet back to bytes, ill-formed UTF-8 shown as U+FFFD),
// Replace, ByteFallback (<0xXX> runs back to text; one U+FFFD per byte of an ill-formed run), Fuse,
// Strip, Metaspace ("▁" back to spaces), and Sequence of these. Others are refused by name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/tokenizer/json_location.hpp"

namespace strata::llm::detail {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// Null when the JSON value is null (tokens are then joined with spaces, as the library does).
std::unique_ptr<Decoder> make_decoder(const JsonLocation& spec);

}  // namespace strata::llm::detail
