// Proves every malformed or unsupported tokenizer file is a TokenizerError naming the file and the
// JSON path of the offending component, and that Tokenizer::load picks the folder's files in the
// documented order and reads bos / eos from its configs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "models/tokenizer/tokenizer.hpp"
#include "tests/models/llm/tokenizer_test_support.hpp"

namespace strata::llm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A complete, tiny tokenizer.json: "a" "b" merge to "ab"; "<bos>" is a special added token.
json tiny_tokenizer() {
  return json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 4, "content": "<bos>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null, "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [], "special_tokens": {"<bos>": {"id": "<bos>", "ids": [4], "tokens": ["<bos>"]}}},
    "decoder": null,
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
              "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3}, "merges": ["a b"]}
  })");
}

struct ErrorCase {
  const char* name;
  std::function<void(json&)> break_file;
  std::vector<std::string> message_parts;  // each must appear in the error
};

void PrintTo(const ErrorCase& error_case, std::ostream* out) {
  *out << error_case.name;
}

std::string load_error(const fs::path& file) {
  try {
    (void)Tokenizer::from_tokenizer_json(file);
  } catch (const TokenizerError& error) {
    return error.what();
  }
  return "(no error)";
}

class BrokenTokenizerJson : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(BrokenTokenizerJson, IsAnErrorNamingFileAndPath) {
  const fs::path dir = test_support::scratch_dir(std::string("broken-") + GetParam().name);
  json file = tiny_tokenizer();
  GetParam().break_file(file);
  test_support::write_file(dir / "tokenizer.json", file.dump());
  const std::string message = load_error(dir / "tokenizer.json");
  EXPECT_NE(message.find((dir / "tokenizer.json").string()), std::string::npos) << message;
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Components, BrokenTokenizerJson,
    ::testing::Values(
        ErrorCase{"WordPieceModel",
                  [](json& f) { f["model"]["type"] = "WordPiece"; },
                  {"/model/type", "unsupported model 'WordPiece'", "BPE"}},
        ErrorCase{"UnknownNormalizer",
                  [](json& f) {
                    f["normalizer"] = {{"type", "NFKC"}};
                  },
                  {"/normalizer/type", "unsupported normalizer 'NFKC'"}},
        ErrorCase{"UnknownPreTokenizerInSequence",
                  [](json& f) {
                    f["pre_tokenizer"] = json::parse(
                        R"({"type": "Sequence", "pretokenizers": [
                              {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
                              {"type": "Whitespace"}]})");
                  },
                  {"/pre_tokenizer/pretokenizers/1/type", "'Whitespace'"}},
        ErrorCase{"RegexThatDoesNotCompile",
                  [](json& f) {
                    f["pre_tokenizer"] = json::parse(
                        R"({"type": "Split", "pattern": {"Regex": "(unclosed"},
                            "behavior": "Isolated", "invert": false})");
                  },
                  {"/pre_tokenizer/pattern/Regex", "does not compile"}},
        ErrorCase{"UnknownSplitBehavior",
                  [](json& f) {
                    f["pre_tokenizer"] = json::parse(
                        R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"})");
                  },
                  {"/pre_tokenizer/behavior", "'Sideways'"}},
        ErrorCase{"UnknownDecoder",
                  [](json& f) {
                    f["decoder"] = {{"type", "WordPiece"}};
                  },
                  {"/decoder/type", "unsupported decoder 'WordPiece'"}},
        ErrorCase{"RobertaPostProcessor",
                  [](json& f) {
                    f["post_processor"] = {{"type", "RobertaProcessing"}};
                  },
                  {"/post_processor/type", "unsupported post_processor 'RobertaProcessing'"}},
        ErrorCase{"TemplateWithUndeclaredToken",
                  [](json& f) { f["post_processor"]["special_tokens"] = json::object(); },
                  {"/post_processor/special_tokens/<bos>", "missing key"}},
        ErrorCase{"MergeOfUnknownToken",
                  [](json& f) { f["model"]["merges"] = {"a x"}; },
                  {"/model", "merge 0", "'x' is not in the vocabulary"}},
        ErrorCase{"MergeThatIsNotAString",
                  [](json& f) { f["model"]["merges"] = {42}; },
                  {"/model/merges/0", "expected a string"}},
        ErrorCase{"MergeWithoutSeparator",
                  [](json& f) { f["model"]["merges"] = {"ab"}; },
                  {"/model/merges/0", "two tokens separated by one space"}},
        ErrorCase{"VocabIdNotANumber",
                  [](json& f) { f["model"]["vocab"]["c"] = "three"; },
                  {"/model/vocab/c", "expected an integer"}},
        ErrorCase{"MissingVocab",
                  [](json& f) { f["model"].erase("vocab"); },
                  {"/model/vocab", "missing key"}},
        ErrorCase{
            "Dropout", [](json& f) { f["model"]["dropout"] = 0.1; }, {"/model/dropout", "dropout"}},
        ErrorCase{"UnknownTokenNotInVocab",
                  [](json& f) { f["model"]["unk_token"] = "<unk>"; },
                  {"/model", "unk_token '<unk>'"}},
        ErrorCase{"SingleWordAddedToken",
                  [](json& f) { f["added_tokens"][0]["single_word"] = true; },
                  {"/added_tokens/0/single_word"}},
        ErrorCase{"Truncation",
                  [](json& f) {
                    f["truncation"] = {{"max_length", 8}};
                  },
                  {"/truncation", "not supported"}}),
    [](const ::testing::TestParamInfo<ErrorCase>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(TokenizerFiles, NotJsonIsNamed) {
  const fs::path dir = test_support::scratch_dir("not-json");
  test_support::write_file(dir / "tokenizer.json", "{\"model\": ");
  const std::string message = load_error(dir / "tokenizer.json");
  EXPECT_NE(message.find((dir / "tokenizer.json").string() + ": not valid JSON"), std::string::npos)
      << message;
}

TEST(TokenizerFiles, TheTinyFileEncodesAndDecodes) {
  const fs::path dir = test_support::scratch_dir("tiny");
  test_support::write_file(dir / "tokenizer.json", tiny_tokenizer().dump());
  const Tokenizer tokenizer = Tokenizer::from_tokenizer_json(dir / "tokenizer.json");
  EXPECT_EQ(tokenizer.encode("abcab"), (std::vector<std::int32_t>{2, 3, 2}));
  EXPECT_EQ(tokenizer.encode("ab<bos>c", true), (std::vector<std::int32_t>{4, 2, 4, 3}));
  EXPECT_EQ(tokenizer.vocab_size(), 5U);
  const std::vector<std::int32_t> ids = {4, 2, 3};
  EXPECT_EQ(tokenizer.decode(ids), "<bos> ab c");  // no decoder: joined by spaces, as HF does
  EXPECT_EQ(tokenizer.decode(ids, true), "ab c");
  EXPECT_TRUE(tokenizer.encode("").empty());
  EXPECT_EQ(tokenizer.encode("", true), (std::vector<std::int32_t>{4}));
  const std::vector<std::int32_t> unknown = {2, 99};
  EXPECT_THROW((void)tokenizer.decode(unknown), TokenizerError);
  EXPECT_THROW((void)tokenizer.id_to_token(99), TokenizerError);
}

TEST(TokenizerFiles, EmptyTextWithoutAddedTokensIsNoIds) {
  const fs::path dir = test_support::scratch_dir("tiny-byte-level");
  json file = tiny_tokenizer();
  file["added_tokens"] = json::array();
  file["post_processor"] = nullptr;
  file["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  test_support::write_file(dir / "tokenizer.json", file.dump());
  const Tokenizer tokenizer = Tokenizer::from_tokenizer_json(dir / "tokenizer.json");
  EXPECT_TRUE(tokenizer.encode("").empty());
  EXPECT_EQ(tokenizer.encode("abc"), (std::vector<std::int32_t>{2, 3}));
}

TEST(TokenizerLoad, PrefersTokenizerJsonAndReadsBosEosFromTheConfigs) {
  const fs::path dir = test_support::scratch_dir("load-order");
  test_support::write_file(dir / "tokenizer.json", tiny_tokenizer().dump());
  test_support::write_file(dir / "tokenizer.model", "not read: tokenizer.json comes first");
  test_support::write_file(
      dir / "tokenizer_config.json",
      R"({"bos_token": {"content": "<bos>", "special": true}, "eos_token": null})");
  test_support::write_file(dir / "special_tokens_map.json", R"({"eos_token": "c"})");
  const Tokenizer tokenizer = Tokenizer::load(dir);
  EXPECT_EQ(tokenizer.bos_id(), 4);
  EXPECT_EQ(tokenizer.eos_id(), 3);
}

TEST(TokenizerLoad, AConfiguredTokenOutsideTheVocabularyIsNamed) {
  const fs::path dir = test_support::scratch_dir("load-bad-eos");
  test_support::write_file(dir / "tokenizer.json", tiny_tokenizer().dump());
  test_support::write_file(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  try {
    (void)Tokenizer::load(dir);
    FAIL() << "loaded with an eos_token outside the vocabulary";
  } catch (const TokenizerError& error) {
    EXPECT_NE(std::string(error.what()).find("eos_token '</s>'"), std::string::npos)
        << error.what();
  }
}

TEST(TokenizerLoad, AFolderWithoutTokenizerFilesIsNamed) {
  const fs::path dir = test_support::scratch_dir("load-empty");
  try {
    (void)Tokenizer::load(dir);
    FAIL() << "loaded an empty folder";
  } catch (const TokenizerError& error) {
    EXPECT_NE(std::string(error.what()).find(dir.string() + ": neither tokenizer.json nor"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace strata::llm
