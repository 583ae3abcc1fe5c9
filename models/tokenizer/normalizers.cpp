#include "models/tokenizer/normalizers.hpp"

#include <vector>

#include "models/tokenizer/nfc.hpp"
#include "models/tokenizer/string_pattern.hpp"

namespace strata::llm::detail {
namespace {

class NfcNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return to_nfc(text); }
};

// Prepends `prefix` to non-empty text (Llama 2 prepends "▁").
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(UnicodeRegex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string text) const override {
    return replace_all(pattern_, text, content_);
  }

 private:
  UnicodeRegex pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const JsonLocation& spec) {
  if (spec.node().is_null()) return nullptr;
  const std::string type = spec.type_among({"NFC", "Prepend", "Replace", "Sequence"}, "normalizer");
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(spec.at("prepend").string());
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(make_pattern(spec.at("pattern")),
                                               spec.at("content").string());
  }
  const JsonLocation list = spec.at("normalizers");
  std::vector<std::unique_ptr<Normalizer>> steps;
  for (std::size_t i = 0; i < list.array_size(); ++i) {
    if (auto step = make_normalizer(list.at(i))) steps.push_back(std::move(step));
  }
  return std::make_unique<SequenceNormalizer>(std::move(steps));
}

}  // namespace strata::llm::detail
