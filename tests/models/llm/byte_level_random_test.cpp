// Proves a byte-level tokenizer (Llama 3's regex, the 256-byte alphabet, no merges) gives one id
// per byte of the U+FFFD-repaired text and decodes back to exactly that text, for seeded random
// byte strings mixing ASCII, whitespace, multi-byte characters, their fragments and stray bytes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "models/tokenizer/byte_level.hpp"
#include "models/tokenizer/tokenizer.hpp"
#include "models/tokenizer/utf8.hpp"
#include "tests/models/llm/tokenizer_test_support.hpp"

namespace strata::llm {
namespace {

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Tokenizer byte_alphabet_tokenizer(const std::filesystem::path& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int byte = 0; byte < 256; ++byte) {
    vocab[detail::ByteLevelAlphabet::instance().encode(std::string(1, static_cast<char>(byte)))] =
        byte;
  }
  const nlohmann::json file = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kLlama3Pattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  test_support::write_file(dir / "tokenizer.json", file.dump());
  return Tokenizer::from_tokenizer_json(dir / "tokenizer.json");
}

std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> kPieces = {"a",
                                                   "Z",
                                                   "7",
                                                   " ",
                                                   "  ",
                                                   "\n",
                                                   "\r\n",
                                                   "\t",
                                                   "'s",
                                                   "'LL",
                                                   ".",
                                                   "!?",
                                                   "\xC3\xA9",
                                                   "\xE6\x97\xA5",
                                                   "\xF0\x9F\x98\x80",
                                                   "\xE2\x80\x8D",
                                                   "\xC2\xA0",
                                                   "\xE3\x80\x80",
                                                   "\xC3",
                                                   "\xE6\x97",
                                                   "\xF0\x9F",
                                                   "\x80",
                                                   "\xFF",
                                                   "\xED\xA0\x80",
                                                   "\xC0\xAF"};
  std::uniform_int_distribution<std::size_t> pick(0, kPieces.size() - 1);
  std::uniform_int_distribution<int> length(0, 40);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text;
  for (int i = length(rng); i > 0; --i) {
    text += pick(rng) == 0 ? std::string(1, static_cast<char>(byte(rng))) : kPieces[pick(rng)];
  }
  return text;
}

TEST(ByteLevelRandom, EveryRepairedByteIsOneIdAndDecodesBack) {
  const std::uint32_t seed = 20261130;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Tokenizer tokenizer = byte_alphabet_tokenizer(test_support::scratch_dir("byte-random"));
  for (int round = 0; round < 2000; ++round) {
    const std::string text = random_text(rng);
    const std::string repaired = detail::repair_utf8(text);
    ASSERT_TRUE(detail::is_valid_utf8(repaired)) << test_support::to_hex(text);
    if (detail::is_valid_utf8(text)) {
      ASSERT_EQ(repaired, text);
    }
    const std::vector<std::int32_t> ids = tokenizer.encode(text);
    ASSERT_EQ(ids.size(), repaired.size()) << test_support::to_hex(text);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(ids[i], static_cast<unsigned char>(repaired[i])) << test_support::to_hex(text);
    }
    ASSERT_EQ(tokenizer.decode(ids), repaired) << test_support::to_hex(text);
  }
}

}  // namespace
}  // namespace strata::llm
