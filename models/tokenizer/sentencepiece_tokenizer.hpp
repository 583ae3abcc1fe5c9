// SentencePieceTokenizer: a SentencePiece tokenizer.model (Llama 2, Mistral) through Debian's
// libsentencepiece, so ids are that library's own. Around it, what Hugging Face adds: control
// pieces written in the text (e.g. "<s>") become their ids, each stretch of text between them
// encoded on its own (so each gets the model's dummy-prefix space, as HF's legacy Llama tokenizer
// does), and add_special_tokens puts bos (and eos, when asked) around the sequence.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "models/tokenizer/tokenizer_backend.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace strata::llm::detail {

struct SentencePieceOptions {
  bool add_bos = true;   // tokenizer_config.json add_bos_token (Llama: true)
  bool add_eos = false;  // tokenizer_config.json add_eos_token
};

class SentencePieceTokenizer final : public TokenizerBackend {
 public:
  // A file that is missing or not a SentencePiece model is a TokenizerError naming it.
  static std::unique_ptr<SentencePieceTokenizer> from_file(const std::filesystem::path& file,
                                                           SentencePieceOptions options);
  ~SentencePieceTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const override;
  std::optional<std::int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(std::int32_t id) const override;
  std::size_t vocab_size() const override;
  std::optional<std::int32_t> own_bos_id() const override;
  std::optional<std::int32_t> own_eos_id() const override;

 private:
  SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> processor,
                         SentencePieceOptions options, std::filesystem::path file);
  void encode_text(std::string_view text, std::vector<std::int32_t>& ids) const;
  std::string decode_run(std::span<const std::int32_t> ids) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  SentencePieceOptions options_;
  std::filesystem::path file_;
  std::vector<std::int32_t> control_ids_;  // longest piece first, for matching in text
};

}  // namespace strata::llm::detail
