// Normalizers of tokenizer.json: the ones the supported model families use. NFC (Qwen2), Prepend
// and Replace (Llama 2's "▁" handling), and Sequence of these. Any other type is refused by name:
// normalizing differently would silently change every id.
#pragma once

#include <memory>
#include <string>

#include "models/tokenizer/json_location.hpp"

namespace strata::llm::detail {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Contract: `text` is valid UTF-8, and so is the result.
  virtual std::string normalize(std::string text) const = 0;
};

// Null when the JSON value is null (no normalizer).
std::unique_ptr<Normalizer> make_normalizer(const JsonLocation& spec);

}  // namespace strata::llm::detail
