// PostProcessor: what tokenizer.json's post_processor adds around one sequence when special tokens
// are requested (HF's add_special_tokens=True). TemplateProcessing's `single` template (e.g.
// "<|begin_of_text|> $A"), ByteLevel (changes offsets only, never ids) and Sequence of these are
// supported; pair templates are not used (strata encodes one sequence at a time). Others
// (RobertaProcessing, BertProcessing) are refused by name.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "models/tokenizer/json_location.hpp"

namespace strata::llm::detail {

class PostProcessor {
 public:
  // A null spec adds nothing.
  static PostProcessor from_json(const JsonLocation& spec);

  std::vector<std::int32_t> apply(std::span<const std::int32_t> sequence) const;

 private:
  void append_spec(const JsonLocation& spec);
  void append_template(const JsonLocation& spec);

  // Applied in order; each wraps the previous result as its $A.
  struct Wrapping {
    std::vector<std::int32_t> before;
    std::vector<std::int32_t> after;
  };
  std::vector<Wrapping> wrappings_;
};

}  // namespace strata::llm::detail
