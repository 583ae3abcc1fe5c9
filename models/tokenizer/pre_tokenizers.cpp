#include "models/tokenizer/pre_tokenizers.hpp"

#include <functional>
#include <vector>

#include "models/tokenizer/byte_level.hpp"
#include "models/tokenizer/string_pattern.hpp"

namespace strata::llm::detail {
namespace {

// The regex GPT-2 split text with, built into the ByteLevel pre-tokenizer (use_regex).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // "▁" U+2581

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  std::size_t begin;
  std::size_t end;
  bool is_match;
};

// The text cut into alternating matched and unmatched spans covering all of it.
std::vector<Span> spans_of(const UnicodeRegex& pattern, std::string_view text, bool invert) {
  std::vector<Span> spans;
  std::size_t covered = 0;
  for (const MatchSpan& match : pattern.find_all(text)) {
    if (match.begin > covered) spans.push_back({covered, match.begin, invert});
    spans.push_back({match.begin, match.end, !invert});
    covered = match.end;
  }
  if (covered < text.size()) spans.push_back({covered, text.size(), invert});
  return spans;
}

// Groups the spans as the library's SplitDelimiterBehavior does.
std::vector<Span> apply_behavior(const std::vector<Span>& spans, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return spans;
    case SplitBehavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.is_match) out.push_back(span);
      }
      return out;
    case SplitBehavior::kContiguous:
      for (const Span& span : spans) {
        if (!out.empty() && span.is_match == previous_match) {
          out.back().end = span.end;
        } else {
          out.push_back(span);
        }
        previous_match = span.is_match;
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back(span);
        }
        previous_match = span.is_match;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
  }
  return out;
}

using PieceSplitter = std::function<std::vector<std::string>(std::string text, bool at_text_start)>;

// Runs `split` on every piece that is still text, keeping order and the at-start flag of the
// first sub-piece.
void split_pieces(TextPieces& pieces, const PieceSplitter& split) {
  TextPieces out;
  out.reserve(pieces.size());
  for (TextPiece& piece : pieces) {
    if (piece.added_token_id) {
      out.push_back(std::move(piece));
      continue;
    }
    if (piece.text.empty()) continue;  // the library drops empty pieces; splitters may assume text
    bool first = true;
    for (std::string& part : split(std::move(piece.text), piece.at_text_start)) {
      if (part.empty()) continue;
      out.push_back(TextPiece{std::move(part), std::nullopt, piece.at_text_start && first});
      first = false;
    }
  }
  pieces = std::move(out);
}

std::vector<std::string> split_text(const UnicodeRegex& pattern, const std::string& text,
                                    bool invert, SplitBehavior behavior) {
  std::vector<std::string> parts;
  for (const Span& span : apply_behavior(spans_of(pattern, text, invert), behavior)) {
    parts.push_back(text.substr(span.begin, span.end - span.begin));
  }
  return parts;
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(UnicodeRegex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(TextPieces& pieces) const override {
    split_pieces(pieces, [this](std::string text, bool) {
      return split_text(pattern_, text, invert_, behavior_);
    });
  }

 private:
  UnicodeRegex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space),
        gpt2_pattern_(use_regex
                          ? std::make_unique<UnicodeRegex>(kGpt2Pattern, PatternSyntax::kRegex)
                          : nullptr) {}
  void pre_tokenize(TextPieces& pieces) const override {
    split_pieces(pieces, [this](std::string text, bool) {
      // The library adds the space to each piece reaching this step, not only the first.
      if (add_prefix_space_ && text.front() != ' ') text.insert(text.begin(), ' ');
      std::vector<std::string> parts;
      if (gpt2_pattern_) {
        parts = split_text(*gpt2_pattern_, text, false, SplitBehavior::kIsolated);
      } else {
        parts.push_back(std::move(text));
      }
      for (std::string& part : parts) part = ByteLevelAlphabet::instance().encode(part);
      return parts;
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<UnicodeRegex> gpt2_pattern_;
};

enum class PrependScheme { kAlways, kNever, kFirst };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        space_(" ", PatternSyntax::kLiteral),
        delimiter_(replacement_, PatternSyntax::kLiteral),
        scheme_(scheme),
        split_(split) {}
  void pre_tokenize(TextPieces& pieces) const override {
    split_pieces(pieces, [this](std::string text, bool at_text_start) {
      text = replace_all(space_, text, replacement_);
      const bool prepend =
          scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_text_start);
      if (prepend && !text.starts_with(replacement_)) text.insert(0, replacement_);
      if (!split_) return std::vector<std::string>{std::move(text)};
      return split_text(delimiter_, text, false, SplitBehavior::kMergedWithNext);
    });
  }

 private:
  std::string replacement_;
  UnicodeRegex space_;
  UnicodeRegex delimiter_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(TextPieces& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

SplitBehavior parse_behavior(const JsonLocation& spec) {
  const std::string name = spec.string();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  spec.fail("unknown split behavior '" + name + "'");
}

PrependScheme parse_prepend_scheme(const JsonLocation& spec) {
  // Files written before prepend_scheme existed say add_prefix_space instead.
  if (!spec.has("prepend_scheme")) {
    return spec.boolean_or("add_prefix_space", true) ? PrependScheme::kAlways
                                                     : PrependScheme::kNever;
  }
  const JsonLocation scheme = spec.at("prepend_scheme");
  const std::string name = scheme.string();
  if (name == "always") return PrependScheme::kAlways;
  if (name == "never") return PrependScheme::kNever;
  if (name == "first") return PrependScheme::kFirst;
  scheme.fail("unknown prepend_scheme '" + name + "'");
}

std::unique_ptr<PreTokenizer> make_metaspace(const JsonLocation& spec) {
  const std::string replacement = spec.string_or("replacement", kMetaspace);
  return std::make_unique<MetaspacePreTokenizer>(replacement, parse_prepend_scheme(spec),
                                                 spec.boolean_or("split", true));
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonLocation& spec) {
  if (spec.node().is_null()) return nullptr;
  const std::string type =
      spec.type_among({"Split", "ByteLevel", "Metaspace", "Sequence"}, "pre_tokenizer");
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(make_pattern(spec.at("pattern")),
                                               parse_behavior(spec.at("behavior")),
                                               spec.boolean_or("invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(spec.boolean_or("add_prefix_space", true),
                                                   spec.boolean_or("use_regex", true));
  }
  if (type == "Metaspace") return make_metaspace(spec);
  const JsonLocation list = spec.at("pretokenizers");
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  for (std::size_t i = 0; i < list.array_size(); ++i) {
    if (auto step = make_pre_tokenizer(list.at(i))) steps.push_back(std::move(step));
  }
  return std::make_unique<SequencePreTokenizer>(std::move(steps));
}

}  // namespace strata::llm::detail
