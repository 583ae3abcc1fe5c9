// Tiny random Hugging Face model folders, written from scratch: config.json, a byte-level BPE
// tokenizer.json (the 256 byte symbols, ten merges, the family's special tokens),
// tokenizer_config.json and safetensors weights (one file, or shards with an index). For the
// tests and `strata-make-tiny-model` (the README's walk-through): no download needed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "models/decoder/hf_config.hpp"
#include "runtime/config/config.hpp"

namespace strata::llm {

struct TinyModelOptions {
  Family family = Family::kLlama;
  std::uint32_t hidden_size = 32;
  std::uint32_t intermediate_size = 64;
  std::uint32_t layers = 2;
  std::uint32_t heads = 4;
  std::uint32_t kv_heads = 2;  // GQA (GPT-2: ignored)
  std::uint32_t max_positions = 256;
  DType dtype = DType::kFp32;
  std::uint64_t max_shard_bytes = 5'000'000'000;  // small values give a sharded checkpoint
  bool gpt2_prefix_stripped = false;              // GPT-2: names without "transformer."
  std::uint64_t seed = 1;
};

// The tokenizer's size: 256 bytes + 10 merges + the family's special tokens.
std::uint32_t tiny_tokenizer_size(Family family);
// vocab_size in config.json: the tokenizer's size rounded up to a multiple of 8.
std::uint32_t tiny_vocab_size(Family family);

std::string tiny_config_json(const TinyModelOptions& options);
std::string tiny_tokenizer_json(Family family);
std::string tiny_tokenizer_config_json(Family family);

// Writes the whole folder (created if missing); weights drawn from `seed`.
void write_tiny_model(const std::filesystem::path& dir, const TinyModelOptions& options);

}  // namespace strata::llm
