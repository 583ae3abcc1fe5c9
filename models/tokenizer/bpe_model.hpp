// BpeModel: the "BPE" model of tokenizer.json. A pre-token (a "word") starts as one symbol per
// character; the adjacent pair whose merge has the lowest rank is merged first, leftmost on ties,
// until no listed merge applies -- the order of the Hugging Face implementation, which a different
// order (e.g. merging every occurrence of a pair at once) can break on repeated characters.
// Characters missing from the vocabulary become <0xXX> byte tokens (byte_fallback, Llama 2), else
// the unknown token (consecutive ones fused when fuse_unk), else they are dropped, as the library
// does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::llm::detail {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token (Llama 3)
};

struct TransparentStringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const noexcept {
    return std::hash<std::string_view>{}(text);
  }
};
using TokenIds =
    std::unordered_map<std::string, std::int32_t, TransparentStringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `merges` in rank order (index 0 merges first). Throws std::invalid_argument naming the entry
  // when a merge's parts or result are not in the vocabulary, or the unknown token is not.
  BpeModel(TokenIds vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions options);

  // Appends the ids of one pre-token to `ids`.
  void encode_word(std::string_view word, std::vector<std::int32_t>& ids) const;

  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(std::int32_t id) const;  // nullptr when no token has this id
  const TokenIds& vocab() const { return vocab_; }

 private:
  struct Merge {
    std::uint32_t rank;
    std::int32_t new_id;
  };
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;  // index into the word's symbols, -1 at the front
    std::int32_t next;  // -1 at the back
    bool removed;
  };

  std::vector<Symbol> initial_symbols(std::string_view word) const;
  void apply_merges(std::vector<Symbol>& symbols) const;
  const Merge* find_merge(std::int32_t left, std::int32_t right) const;

  TokenIds vocab_;
  std::vector<const std::string*> token_of_id_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  BpeOptions options_;
  std::optional<std::int32_t> unk_id_;
};

}  // namespace strata::llm::detail
