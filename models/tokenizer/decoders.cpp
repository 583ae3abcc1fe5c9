#include "models/tokenizer/decoders.hpp"

#include <charconv>
#include <optional>

#include "models/tokenizer/byte_level.hpp"
#include "models/tokenizer/string_pattern.hpp"
#include "models/tokenizer/utf8.hpp"

namespace strata::llm::detail {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // "▁" U+2581

class ByteLevelDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      // A token outside the alphabet (an added token like "<|eot_id|>" with a space) stays as text.
      if (!ByteLevelAlphabet::instance().decode(token, bytes)) bytes.append(token);
    }
    return {repair_utf8(bytes)};
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(UnicodeRegex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& token : tokens) token = replace_all(pattern_, token, content_);
    return tokens;
  }

 private:
  UnicodeRegex pattern_;
  std::string content_;
};

// "<0x41>" -> 0x41; anything else -> nothing.
std::optional<unsigned char> byte_of_token(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  unsigned value = 0;
  const char* first = token.data() + 3;
  const auto [end, error] = std::from_chars(first, first + 2, value, 16);
  if (error != std::errc() || end != first + 2) return std::nullopt;
  return static_cast<unsigned char>(value);
}

class ByteFallbackDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string pending_bytes;
    auto flush = [&out, &pending_bytes] {
      if (pending_bytes.empty()) return;
      if (is_valid_utf8(pending_bytes)) {
        out.push_back(pending_bytes);
      } else {
        out.insert(out.end(), pending_bytes.size(), std::string(kReplacementCharacter));
      }
      pending_bytes.clear();
    };
    for (std::string& token : tokens) {
      if (const auto byte = byte_of_token(token)) {
        pending_bytes.push_back(static_cast<char>(*byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    return out;
  }
};

class FuseDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    return {joined};
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& token : tokens) {
      std::string_view view = token;
      for (std::size_t i = 0; i < start_ && view.starts_with(content_); ++i) {
        view.remove_prefix(content_.size());
      }
      for (std::size_t i = 0; i < stop_ && view.ends_with(content_); ++i) {
        view.remove_suffix(content_.size());
      }
      token = std::string(view);
    }
    return tokens;
  }

 private:
  std::string content_;
  std::size_t start_;
  std::size_t stop_;
};

// "▁" back to spaces; in the first token the library drops them instead when a prefix was added.
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prefix_added)
      : replacement_(replacement, PatternSyntax::kLiteral), prefix_added_(prefix_added) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = replace_all(replacement_, tokens[i], i == 0 && prefix_added_ ? "" : " ");
    }
    return tokens;
  }

 private:
  UnicodeRegex replacement_;
  bool prefix_added_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& step : steps_) tokens = step->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

std::size_t count_of(const JsonLocation& spec, std::string_view key) {
  const std::int64_t value = spec.at(key).integer();
  if (value < 0) spec.at(key).fail("must not be negative");
  return static_cast<std::size_t>(value);
}

std::unique_ptr<Decoder> make_strip(const JsonLocation& spec) {
  const std::string content = spec.at("content").string();
  if (content.empty() || valid_sequence_bytes(content, 0) != content.size()) {
    spec.at("content").fail("must be exactly one character");
  }
  return std::make_unique<StripDecoder>(content, count_of(spec, "start"), count_of(spec, "stop"));
}

std::unique_ptr<Decoder> make_metaspace(const JsonLocation& spec) {
  bool prefix_added = spec.boolean_or("add_prefix_space", true);
  if (spec.has("prepend_scheme")) prefix_added = spec.at("prepend_scheme").string() != "never";
  return std::make_unique<MetaspaceDecoder>(spec.string_or("replacement", kMetaspace),
                                            prefix_added);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const JsonLocation& spec) {
  if (spec.node().is_null()) return nullptr;
  const std::string type = spec.type_among(
      {"ByteLevel", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace", "Sequence"},
      "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(make_pattern(spec.at("pattern")),
                                            spec.at("content").string());
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return make_strip(spec);
  if (type == "Metaspace") return make_metaspace(spec);
  const JsonLocation list = spec.at("decoders");
  std::vector<std::unique_ptr<Decoder>> steps;
  for (std::size_t i = 0; i < list.array_size(); ++i) {
    if (auto step = make_decoder(list.at(i))) steps.push_back(std::move(step));
  }
  return std::make_unique<SequenceDecoder>(std::move(steps));
}

}  // namespace strata::llm::detail
