#include "models/tokenizer/bpe_model.hpp"

#include <cstdio>
#include <queue>
#include <stdexcept>

#include "models/tokenizer/utf8.hpp"

namespace strata::llm::detail {
namespace {

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32U) |
         static_cast<std::uint32_t>(right);
}

std::string byte_token(unsigned char byte) {
  char text[8];
  std::snprintf(text, sizeof text, "<0x%02X>", byte);
  return text;
}

// A candidate merge of the symbol at `pos` with its successor. Lower rank first, then leftmost.
struct Candidate {
  std::uint32_t rank;
  std::int32_t pos;
  std::int32_t new_id;
  bool operator<(const Candidate& other) const {
    if (rank != other.rank) return rank > other.rank;
    return pos > other.pos;
  }
};

}  // namespace

BpeModel::BpeModel(TokenIds vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  for (const auto& [token, id] : vocab_) {
    if (id < 0) throw std::invalid_argument("token '" + token + "' has negative id");
    if (static_cast<std::size_t>(id) >= token_of_id_.size()) token_of_id_.resize(id + 1, nullptr);
    token_of_id_[id] = &token;
  }
  if (options_.unk_token) {
    unk_id_ = token_to_id(*options_.unk_token);
    if (!unk_id_) {
      throw std::invalid_argument("unk_token '" + *options_.unk_token +
                                  "' is not in the vocabulary");
    }
  }
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto left_id = token_to_id(left);
    const auto right_id = token_to_id(right);
    const auto new_id = token_to_id(left + right);
    if (!left_id || !right_id || !new_id) {
      const std::string& missing = !left_id ? left : !right_id ? right : left + right;
      throw std::invalid_argument("merge " + std::to_string(rank) + " ('" + left + "' '" + right +
                                  "'): token '" + missing + "' is not in the vocabulary");
    }
    // A repeated pair keeps its last rank, as the library's map insertion does.
    merges_.insert_or_assign(pair_key(*left_id, *right_id),
                             Merge{static_cast<std::uint32_t>(rank), *new_id});
  }
}

std::optional<std::int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= token_of_id_.size()) return nullptr;
  return token_of_id_[id];
}

const BpeModel::Merge* BpeModel::find_merge(std::int32_t left, std::int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<BpeModel::Symbol> BpeModel::initial_symbols(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto push = [&symbols](std::int32_t id) {
    const auto index = static_cast<std::int32_t>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, -1, false});
  };
  // An unknown character is held back until the next known one (or the end), so that consecutive
  // unknowns can fuse; byte-fallback tokens do not flush it. Same order as the library.
  bool unk_pending = false;
  for (std::size_t pos = 0; pos < word.size();) {
    const std::size_t length = valid_sequence_bytes(word, pos);
    const std::string_view character = word.substr(pos, length == 0 ? 1 : length);
    pos += character.size();
    if (const auto id = token_to_id(character)) {
      if (unk_pending) push(*unk_id_);
      unk_pending = false;
      push(*id);
      continue;
    }
    if (options_.byte_fallback) {
      std::vector<std::int32_t> byte_ids;
      for (const char byte : character) {
        const auto id = token_to_id(byte_token(static_cast<unsigned char>(byte)));
        if (!id) break;
        byte_ids.push_back(*id);
      }
      if (byte_ids.size() == character.size()) {
        for (const std::int32_t id : byte_ids) push(id);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_pending && !options_.fuse_unk) push(*unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) push(*unk_id_);
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
    symbols[i].next = static_cast<std::int32_t>(i + 1);
  }
  return symbols;
}

void BpeModel::apply_merges(std::vector<Symbol>& symbols) const {
  std::priority_queue<Candidate> queue;
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* merge = find_merge(symbols[i].id, symbols[i + 1].id)) {
      queue.push(Candidate{merge->rank, static_cast<std::int32_t>(i), merge->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Entries go stale when a neighbour merged first; only a pair that still merges into the
    // same token is applied.
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* merge = find_merge(symbols[left.prev].id, left.id)) {
        queue.push(Candidate{merge->rank, left.prev, merge->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* merge = find_merge(left.id, symbols[left.next].id)) {
        queue.push(Candidate{merge->rank, top.pos, merge->new_id});
      }
    }
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<Symbol> symbols = initial_symbols(word);
  apply_merges(symbols);
  for (const Symbol& symbol : symbols) {
    if (!symbol.removed) ids.push_back(symbol.id);
  }
}

}  // namespace strata::llm::detail
