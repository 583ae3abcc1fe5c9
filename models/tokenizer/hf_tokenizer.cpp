#include "models/tokenizer/hf_tokenizer.hpp"

#include "models/tokenizer/bpe_model_json.hpp"
#include "models/tokenizer/utf8.hpp"

namespace strata::llm::detail {
namespace {

AddedToken read_added_token(const JsonLocation& spec) {
  if (spec.boolean_or("single_word", false)) {
    spec.at("single_word").fail("added tokens with single_word are not supported");
  }
  AddedToken token;
  token.content = spec.at("content").string();
  const std::int64_t id = spec.at("id").integer();
  if (id < 0 || id > INT32_MAX) spec.at("id").fail("id " + std::to_string(id) + " out of range");
  token.id = static_cast<std::int32_t>(id);
  token.special = spec.boolean_or("special", false);
  token.normalized = spec.boolean_or("normalized", !token.special);
  token.lstrip = spec.boolean_or("lstrip", false);
  token.rstrip = spec.boolean_or("rstrip", false);
  return token;
}

std::vector<AddedToken> read_added_tokens(const JsonLocation& root) {
  std::vector<AddedToken> tokens;
  if (!root.has("added_tokens")) return tokens;
  const JsonLocation list = root.at("added_tokens");
  for (std::size_t i = 0; i < list.array_size(); ++i)
    tokens.push_back(read_added_token(list.at(i)));
  return tokens;
}

std::vector<AddedToken> select(const std::vector<AddedToken>& tokens, bool normalized) {
  std::vector<AddedToken> selected;
  for (const AddedToken& token : tokens) {
    if (token.normalized == normalized) selected.push_back(token);
  }
  return selected;
}

// Truncation and padding would change the ids of a single encode; strata never applies them.
void refuse_if_set(const JsonLocation& root, std::string_view key) {
  if (root.has(key)) root.at(key).fail(std::string(key) + " is not supported (expected null)");
}

}  // namespace

std::unique_ptr<HfTokenizer> HfTokenizer::from_file(const std::filesystem::path& file) {
  const nlohmann::json json = read_json_file(file);
  const JsonLocation root(json, file);
  if (!json.is_object()) root.fail("expected a JSON object");
  refuse_if_set(root, "truncation");
  refuse_if_set(root, "padding");
  auto model = make_bpe_model(root.at("model"));
  std::vector<AddedToken> added_tokens = read_added_tokens(root);
  return std::unique_ptr<HfTokenizer>(
      new HfTokenizer(root, std::move(model), std::move(added_tokens)));
}

HfTokenizer::HfTokenizer(const JsonLocation& root, std::unique_ptr<BpeModel> model,
                         std::vector<AddedToken> added_tokens)
    : model_(std::move(model)),
      added_tokens_(std::move(added_tokens)),
      raw_matcher_(select(added_tokens_, false)),
      normalized_matcher_(select(added_tokens_, true)),
      normalizer_(root.has("normalizer") ? make_normalizer(root.at("normalizer")) : nullptr),
      pre_tokenizer_(root.has("pre_tokenizer") ? make_pre_tokenizer(root.at("pre_tokenizer"))
                                               : nullptr),
      post_processor_(root.has("post_processor")
                          ? PostProcessor::from_json(root.at("post_processor"))
                          : PostProcessor{}),
      decoder_(root.has("decoder") ? make_decoder(root.at("decoder")) : nullptr) {
  for (std::size_t i = 0; i < added_tokens_.size(); ++i) {
    added_index_of_id_.emplace(added_tokens_[i].id, i);
    added_id_of_content_.emplace(added_tokens_[i].content, added_tokens_[i].id);
  }
}

std::vector<std::int32_t> HfTokenizer::encode(std::string_view text,
                                              bool add_special_tokens) const {
  TextPieces pieces;
  pieces.push_back(TextPiece{repair_utf8(text), std::nullopt, true});
  raw_matcher_.split(pieces);
  if (normalizer_) {
    for (TextPiece& piece : pieces) {
      if (!piece.added_token_id) piece.text = normalizer_->normalize(std::move(piece.text));
    }
    std::erase_if(pieces, [](const TextPiece& piece) { return piece.text.empty(); });
  }
  normalized_matcher_.split(pieces);
  if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
  std::vector<std::int32_t> ids;
  for (const TextPiece& piece : pieces) {
    if (piece.added_token_id) {
      ids.push_back(*piece.added_token_id);
    } else {
      model_->encode_word(piece.text, ids);
    }
  }
  return add_special_tokens ? post_processor_.apply(ids) : ids;
}

const AddedToken* HfTokenizer::added_token_of_id(std::int32_t id) const {
  const auto it = added_index_of_id_.find(id);
  return it == added_index_of_id_.end() ? nullptr : &added_tokens_[it->second];
}

std::string HfTokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const std::int32_t id : ids) {
    if (const AddedToken* added = added_token_of_id(id)) {
      if (!(skip_special_tokens && added->special)) tokens.push_back(added->content);
    } else if (const std::string* token = model_->id_to_token(id)) {
      tokens.push_back(*token);
    } else {
      throw TokenizerError("decode: no token has id " + std::to_string(id) + " (vocabulary of " +
                           std::to_string(vocab_size()) + ")");
    }
  }
  if (decoder_) tokens = decoder_->decode_chain(std::move(tokens));
  std::string text;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (!decoder_ && i > 0) text += ' ';
    text += tokens[i];
  }
  return text;
}

std::optional<std::int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  const auto it = added_id_of_content_.find(token);
  if (it != added_id_of_content_.end()) return it->second;
  return model_->token_to_id(token);
}

std::optional<std::string> HfTokenizer::id_to_token(std::int32_t id) const {
  if (const AddedToken* added = added_token_of_id(id)) return added->content;
  if (const std::string* token = model_->id_to_token(id)) return *token;
  return std::nullopt;
}

std::size_t HfTokenizer::vocab_size() const {
  // The library counts distinct token strings of the vocabulary and the added tokens.
  std::size_t size = model_->vocab().size();
  for (const auto& [content, id] : added_id_of_content_) {
    if (!model_->token_to_id(content)) ++size;
  }
  return size;
}

}  // namespace strata::llm::detail
