#include "models/tokenizer/bpe_model_json.hpp"

#include <stdexcept>

namespace strata::llm::detail {
namespace {

// Ids are dense in practice; this bound only keeps a corrupt file from sizing a huge id table.
constexpr std::int64_t kMaxTokenId = std::int64_t{1} << 26;

TokenIds read_vocab(const JsonLocation& vocab) {
  if (!vocab.node().is_object()) vocab.fail("expected an object of token: id");
  TokenIds ids;
  ids.reserve(vocab.node().size());
  // Locations are built only for a bad entry: a vocabulary has 10^5 of them.
  for (const auto& [token, value] : vocab.node().items()) {
    if (!value.is_number_integer()) vocab.at(token).integer();  // throws, naming the entry
    const auto id = value.get<std::int64_t>();
    if (id < 0 || id >= kMaxTokenId)
      vocab.at(token).fail("id " + std::to_string(id) + " out of range");
    ids.emplace(token, static_cast<std::int32_t>(id));
  }
  return ids;
}

std::pair<std::string, std::string> read_merge(const nlohmann::json& node,
                                               const JsonLocation& merges, std::size_t index) {
  // The common, well-formed entries without building a location.
  if (node.is_array() && node.size() == 2 && node[0].is_string() && node[1].is_string()) {
    return {node[0].get<std::string>(), node[1].get<std::string>()};
  }
  const JsonLocation merge = merges.at(index);
  if (merge.node().is_array()) {
    if (merge.array_size() != 2) merge.fail("a merge pair has exactly two tokens");
    return {merge.at(std::size_t{0}).string(), merge.at(std::size_t{1}).string()};
  }
  const std::string text = merge.string();
  const std::size_t space = text.find(' ');
  if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
    merge.fail("a merge string is two tokens separated by one space, found '" + text + "'");
  }
  return {text.substr(0, space), text.substr(space + 1)};
}

void refuse_affix(const JsonLocation& model, std::string_view key) {
  if (model.has(key) && !model.at(key).string().empty()) {
    model.at(key).fail("BPE with a " + std::string(key) + " is not supported");
  }
}

}  // namespace

std::unique_ptr<BpeModel> make_bpe_model(const JsonLocation& model) {
  // Old files leave the type out; the library then recognises BPE by its merges.
  if (model.has("type") || !model.has("merges")) model.type_among({"BPE"}, "model");
  if (model.has("dropout")) {
    const JsonLocation dropout = model.at("dropout");
    if (!dropout.node().is_number()) dropout.fail("expected a number or null");
    if (dropout.node().get<double>() != 0.0) {
      dropout.fail("BPE dropout samples merges at random; strata encodes reproducibly");
    }
  }
  refuse_affix(model, "continuing_subword_prefix");
  refuse_affix(model, "end_of_word_suffix");
  const JsonLocation merges_spec = model.at("merges");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_spec.array_size());
  for (std::size_t i = 0; i < merges_spec.array_size(); ++i) {
    merges.push_back(read_merge(merges_spec.node()[i], merges_spec, i));
  }
  BpeOptions options;
  options.unk_token = model.optional_string("unk_token");
  options.fuse_unk = model.boolean_or("fuse_unk", false);
  options.byte_fallback = model.boolean_or("byte_fallback", false);
  options.ignore_merges = model.boolean_or("ignore_merges", false);
  try {
    return std::make_unique<BpeModel>(read_vocab(model.at("vocab")), merges, std::move(options));
  } catch (const std::invalid_argument& error) {
    model.fail(error.what());
  }
}

}  // namespace strata::llm::detail
