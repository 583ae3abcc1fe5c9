// HfTokenizer: a tokenizer.json of the Hugging Face tokenizers library, run as that library's
// pipeline does: added tokens split off the raw text, normalizer, added tokens with
// normalized=true, pre-tokenizer, BPE model per word, post-processor when special tokens are asked
// for; decode maps ids to tokens and runs the decoder. Invalid UTF-8 input is first repaired
// (utf8.hpp), as the text the library receives always is. The model must be "BPE"; anything strata
// does not implement (another model, a normalizer, pre-tokenizer, decoder or post-processor type,
// BPE dropout, truncation or padding, single_word added tokens) is a TokenizerError naming the file
// and JSON path.
#pragma once

#include <filesystem>
#include <memory>
#include <unordered_map>

#include "models/tokenizer/added_tokens.hpp"
#include "models/tokenizer/bpe_model.hpp"
#include "models/tokenizer/decoders.hpp"
#include "models/tokenizer/json_location.hpp"
#include "models/tokenizer/normalizers.hpp"
#include "models/tokenizer/post_processor.hpp"
#include "models/tokenizer/pre_tokenizers.hpp"
#include "models/tokenizer/tokenizer_backend.hpp"

namespace strata::llm::detail {

class HfTokenizer final : public TokenizerBackend {
 public:
  static std::unique_ptr<HfTokenizer> from_file(const std::filesystem::path& file);

  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const override;
  std::optional<std::int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(std::int32_t id) const override;
  std::size_t vocab_size() const override;

 private:
  HfTokenizer(const JsonLocation& root, std::unique_ptr<BpeModel> model,
              std::vector<AddedToken> added_tokens);
  const AddedToken* added_token_of_id(std::int32_t id) const;

  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<std::int32_t, std::size_t> added_index_of_id_;  // into added_tokens_
  TokenIds added_id_of_content_;
  AddedTokenMatcher raw_matcher_;         // normalized=false: matched in the raw text
  AddedTokenMatcher normalized_matcher_;  // normalized=true: matched after normalization
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  PostProcessor post_processor_;
  std::unique_ptr<Decoder> decoder_;
};

}  // namespace strata::llm::detail
