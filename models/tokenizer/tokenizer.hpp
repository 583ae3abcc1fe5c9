// Tokenizer: the tokenizer of a Hugging Face model folder, giving the ids the Hugging Face
// tokenizers library gives.
//   - tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen2): the pre-tokenizer's
//     Split regexes with Unicode classes (PCRE2), the byte-level alphabet, merges by rank, added
//     and special tokens matched in the text before pre-tokenisation, decode back to bytes.
//   - tokenizer.json with a SentencePiece-style BPE model, or tokenizer.model (Llama 2, Mistral)
//     through libsentencepiece.
// Unsupported tokenizer.json components are a TokenizerError naming the file and the component.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata::llm {

class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Immutable once loaded: const calls may run on several threads at once. docs/llm.md
// ("Tokenizers") lists what is supported and how it is verified.
class Tokenizer {
 public:
  // The model folder's tokenizer.json, or else its tokenizer.model. Special-token ids for bos/eos
  // come from tokenizer_config.json / special_tokens_map.json when present.
  static Tokenizer load(const std::filesystem::path& model_dir);
  static Tokenizer from_tokenizer_json(const std::filesystem::path& file);
  static Tokenizer from_sentencepiece(const std::filesystem::path& file);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text (UTF-8; invalid sequences are encoded as the library does: each maximal ill-formed
  // subsequence is first replaced by U+FFFD, as Python's errors="replace" / JavaScript's
  // TextDecoder hand it to the library) to ids. Added / special
  // tokens written in the text (e.g. "<|eot_id|>") become their ids. add_special_tokens: also
  // apply the post-processor (e.g. Llama's leading <s> / <|begin_of_text|>), as HF's
  // `encode(text, add_special_tokens=True)` does.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(std::int32_t id) const;
  std::size_t vocab_size() const;  // including added tokens
  std::optional<std::int32_t> bos_id() const;
  std::optional<std::int32_t> eos_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::llm
