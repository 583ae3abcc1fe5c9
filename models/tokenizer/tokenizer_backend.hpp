// TokenizerBackend: what Tokenizer forwards to, one implementation per file format
// (HfTokenizer for tokenizer.json, SentencePieceTokenizer for tokenizer.model). Implementations are
// immutable after construction, so const calls may run on several threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::llm::detail {

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  virtual std::vector<std::int32_t> encode(std::string_view text,
                                           bool add_special_tokens) const = 0;
  // Throws TokenizerError for an id that no token has.
  virtual std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const = 0;
  virtual std::optional<std::int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(std::int32_t id) const = 0;
  virtual std::size_t vocab_size() const = 0;
  // What the file itself says about bos / eos (a SentencePiece model does; tokenizer.json does
  // not).
  virtual std::optional<std::int32_t> own_bos_id() const { return std::nullopt; }
  virtual std::optional<std::int32_t> own_eos_id() const { return std::nullopt; }
};

}  // namespace strata::llm::detail
