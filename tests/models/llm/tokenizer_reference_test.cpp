// Proves strata's Tokenizer gives exactly the Hugging Face tokenizers library's ids (with and
// without special tokens), decodes and vocabulary on real GPT-2, Llama 3 and Llama 2 vocabularies,
// over a corpus of multilingual text, code, whitespace runs, digits, emoji, contractions, special
// tokens and invalid UTF-8; the reference is that library itself, run by make_reference.mjs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "models/tokenizer/tokenizer.hpp"
#include "models/tokenizer/utf8.hpp"
#include "tests/models/llm/tokenizer_test_support.hpp"

namespace strata::llm {
namespace {

namespace fs = std::filesystem;
using test_support::from_hex;
using test_support::to_hex;

const fs::path kReferenceDir = STRATA_LLM_TOKENIZER_TEST_DIR;

// Where decode(encode(x)) == x must hold for valid UTF-8: byte-level BPE without a prefix space or
// normalizer is lossless; Llama 2's Prepend/Strip form is too, unless the text holds special
// tokens (each stretch after one gets its own "▁"); the rest add spaces (prefix space, lstrip),
// normalize (NFC) or drop them (Metaspace's first token), as the library does.
enum class RoundTrip { kEveryString, kWithoutSpecialTokens, kNotLossless };

struct ReferenceCase {
  const char* name;
  RoundTrip round_trip;
};

bool has_special_token(const nlohmann::json& tokens) {
  for (const auto& token : tokens) {
    const auto text = token.get<std::string>();
    if (text == "<s>" || text == "</s>" || text == "<unk>") return true;
  }
  return false;
}

// Names the case in test listings (instead of its bytes, which hold pointers).
void PrintTo(const ReferenceCase& reference_case, std::ostream* out) {
  *out << reference_case.name;
}

std::string skip_reason() {
  const std::string node = STRATA_NODE_EXECUTABLE;
  if (node.empty() || !fs::exists(node)) {
    return "node not found (Debian package nodejs); the reference is the Hugging Face tokenizers "
           "library's Node binding";
  }
  if (!fs::exists(kReferenceDir / "node_modules/@anush008/tokenizers") ||
      !fs::exists(kReferenceDir / "node_modules/llama3-tokenizer-js")) {
    return "the npm reference packages are not installed: run scripts/install-npm-test-deps.sh";
  }
  return {};
}

// Runs the reference for one tokenizer; returns its folder (tokenizer.json, expected.json).
fs::path make_reference(const std::string& name) {
  const fs::path out = test_support::scratch_dir("tokenizer-reference-" + name);
  std::string command = STRATA_NODE_EXECUTABLE;
  for (const std::string& argument :
       {(kReferenceDir / "make_reference.mjs").string(), out.string()}) {
    command += " '";
    command += argument;
    command += "'";
  }
  command += " ";
  command += name;
  const int status = std::system(command.c_str());
  if (status != 0)
    throw std::runtime_error("reference failed (" + std::to_string(status) + "): " + command);
  return out / name;
}

std::vector<std::int32_t> ids_of(const nlohmann::json& array) {
  return array.get<std::vector<std::int32_t>>();
}

class HfReference : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(HfReference, IdsAndDecodesEqualTheLibrary) {
  if (const std::string reason = skip_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const ReferenceCase param = GetParam();
  const fs::path dir = make_reference(param.name);
  const nlohmann::json expected =
      nlohmann::json::parse(test_support::read_file(dir / "expected.json"));
  const Tokenizer tokenizer = Tokenizer::from_tokenizer_json(dir / "tokenizer.json");

  EXPECT_EQ(tokenizer.vocab_size(), expected["vocab_size"].get<std::size_t>());
  for (const auto& [token, id] : expected["token_ids"].items()) {
    const auto ours = tokenizer.token_to_id(token);
    if (id.is_null()) {
      EXPECT_FALSE(ours.has_value()) << token;
    } else {
      EXPECT_EQ(ours, id.get<std::int32_t>()) << token;
    }
  }
  std::size_t compared = 0;
  std::size_t round_trips = 0;
  for (const nlohmann::json& item : expected["cases"]) {
    const std::string input = from_hex(item["input_hex"].get<std::string>());
    SCOPED_TRACE("input (hex) " + item["input_hex"].get<std::string>() + ": '" + input + "'");
    const std::vector<std::int32_t> ids = tokenizer.encode(input);
    ASSERT_EQ(ids, ids_of(item["ids"])) << "HF's tokens: " << item["tokens"].dump();
    const std::vector<std::int32_t> with_special = tokenizer.encode(input, true);
    EXPECT_EQ(with_special, ids_of(item["ids_with_special"]));
    EXPECT_EQ(to_hex(tokenizer.decode(ids)), item["decoded_hex"].get<std::string>());
    EXPECT_EQ(to_hex(tokenizer.decode(with_special, true)),
              item["decoded_skip_special_hex"].get<std::string>());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(tokenizer.id_to_token(ids[i]), item["id_tokens"][i].get<std::string>());
    }
    ++compared;
    const bool valid_utf8 = detail::is_valid_utf8(input);
    const bool must_round_trip = param.round_trip == RoundTrip::kEveryString ||
                                 (param.round_trip == RoundTrip::kWithoutSpecialTokens &&
                                  !has_special_token(item["tokens"]));
    if (must_round_trip && valid_utf8) {
      EXPECT_EQ(tokenizer.decode(ids), input) << "decode(encode(x)) != x";
      ++round_trips;
    }
  }
  EXPECT_GE(compared, 60U);
  if (param.round_trip != RoundTrip::kNotLossless) {
    EXPECT_GE(round_trips, 40U);
  }
  std::printf(
      "[ reference ] %s: %zu strings compared with Hugging Face tokenizers (ids, ids with "
      "special tokens, tokens, decode, decode skipping special): %s; %zu round trips\n",
      param.name, compared, HasFailure() ? "DIFFERENCES" : "all identical", round_trips);
  // The files stay for inspection when something differed; else they go (Llama 3's is 7 MB).
  if (!HasFailure()) fs::remove_all(dir.parent_path());
}

INSTANTIATE_TEST_SUITE_P(
    Vocabularies, HfReference,
    ::testing::Values(ReferenceCase{"gpt2", RoundTrip::kEveryString},
                      ReferenceCase{"gpt2_prefix_space", RoundTrip::kNotLossless},
                      ReferenceCase{"llama3", RoundTrip::kEveryString},
                      ReferenceCase{"qwen2_style", RoundTrip::kNotLossless},
                      ReferenceCase{"llama2", RoundTrip::kWithoutSpecialTokens},
                      ReferenceCase{"llama2_metaspace", RoundTrip::kNotLossless},
                      ReferenceCase{"gpt2_split_behaviors", RoundTrip::kNotLossless},
                      ReferenceCase{"llama2_metaspace_split", RoundTrip::kNotLossless}),
    [](const ::testing::TestParamInfo<ReferenceCase>& param_info) {
      return std::string(param_info.param.name);
    });

}  // namespace
}  // namespace strata::llm
