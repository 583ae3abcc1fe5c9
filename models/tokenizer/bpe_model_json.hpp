// Reads tokenizer.json's "model" object into a BpeModel: vocab, merges in either form the library
// writes ("a b" strings, or ["a", "b"] pairs since tokenizers 0.20), unk_token, fuse_unk,
// byte_fallback, ignore_merges. Refused by name: other model types (WordPiece, Unigram, WordLevel),
// BPE dropout (random, so not reproducible), a continuing_subword_prefix or end_of_word_suffix.
#pragma once

#include <memory>

#include "models/tokenizer/bpe_model.hpp"
#include "models/tokenizer/json_location.hpp"

namespace strata::llm::detail {

std::unique_ptr<BpeModel> make_bpe_model(const JsonLocation& model);

}  // namespace strata::llm::detail
