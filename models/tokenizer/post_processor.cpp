#include "models/tokenizer/post_processor.hpp"

namespace strata::llm::detail {

PostProcessor PostProcessor::from_json(const JsonLocation& spec) {
  PostProcessor processor;
  if (!spec.node().is_null()) processor.append_spec(spec);
  return processor;
}

void PostProcessor::append_spec(const JsonLocation& spec) {
  const std::string type =
      spec.type_among({"TemplateProcessing", "ByteLevel", "Sequence"}, "post_processor");
  if (type == "TemplateProcessing") {
    append_template(spec);
  } else if (type == "Sequence") {
    const JsonLocation list = spec.at("processors");
    for (std::size_t i = 0; i < list.array_size(); ++i) append_spec(list.at(i));
  }
  // ByteLevel: offsets only.
}

void PostProcessor::append_template(const JsonLocation& spec) {
  const JsonLocation single = spec.at("single");
  const JsonLocation special_tokens = spec.at("special_tokens");
  Wrapping wrapping;
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.array_size(); ++i) {
    const JsonLocation item = single.at(i);
    if (item.has("Sequence")) {
      if (seen_sequence) item.fail("a single-sequence template holds $A once");
      const std::string id = item.at("Sequence").at("id").string();
      if (id != "A") item.at("Sequence").at("id").fail("expected sequence 'A', found '" + id + "'");
      seen_sequence = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").string();
    const JsonLocation ids = special_tokens.at(name).at("ids");
    std::vector<std::int32_t>& side = seen_sequence ? wrapping.after : wrapping.before;
    for (std::size_t k = 0; k < ids.array_size(); ++k) {
      side.push_back(static_cast<std::int32_t>(ids.at(k).integer()));
    }
  }
  if (!seen_sequence) single.fail("the template never places the sequence $A");
  wrappings_.push_back(std::move(wrapping));
}

std::vector<std::int32_t> PostProcessor::apply(std::span<const std::int32_t> sequence) const {
  std::vector<std::int32_t> ids(sequence.begin(), sequence.end());
  for (const Wrapping& wrapping : wrappings_) {
    std::vector<std::int32_t> wrapped = wrapping.before;
    wrapped.insert(wrapped.end(), ids.begin(), ids.end());
    wrapped.insert(wrapped.end(), wrapping.after.begin(), wrapping.after.end());
    ids = std::move(wrapped);
  }
  return ids;
}

}  // namespace strata::llm::detail
