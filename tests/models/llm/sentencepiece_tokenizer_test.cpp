// Proves the tokenizer.model path returns libsentencepiece's own ids and text for a model trained
// here (a self-consistency check of the wrapper: the reference is the same library; the ids of
// Llama 2's real vocabulary are checked against Hugging Face in tokenizer_reference_test.cpp), that
// bos / eos follow the model and tokenizer_config.json, and that control pieces in text become ids.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "models/tokenizer/tokenizer.hpp"
#include "tests/models/llm/tokenizer_test_support.hpp"

namespace strata::llm {
namespace {

namespace fs = std::filesystem;

const fs::path kTestDir = STRATA_LLM_TOKENIZER_TEST_DIR;

// corpus.json's strings: the valid texts and the invalid-UTF-8 byte strings.
std::vector<std::string> corpus() {
  const auto json = nlohmann::json::parse(test_support::read_file(kTestDir / "corpus.json"));
  std::vector<std::string> strings = json["text"].get<std::vector<std::string>>();
  for (const auto& hex : json["bytes_hex"])
    strings.push_back(test_support::from_hex(hex.get<std::string>()));
  return strings;
}

class SentencePieceModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test_support::scratch_dir("sentencepiece-model"));
    std::string training_text;
    for (int repeat = 0; repeat < 4; ++repeat) {
      for (const std::string& text : corpus()) training_text += text + "\n";
    }
    test_support::write_file(*dir_ / "train.txt", training_text);
    fs::create_directories(*dir_ / "model");
    // Llama 2's settings in small: BPE, byte fallback (coverage below 1 leaves rare characters to
    // the byte pieces), digits split, whitespace kept.
    const std::string args = "--input=" + (*dir_ / "train.txt").string() +
                             " --model_prefix=" + (*dir_ / "tokenizer").string() +
                             " --vocab_size=800 --model_type=bpe --byte_fallback=true"
                             " --character_coverage=0.98 --split_digits=true"
                             " --remove_extra_whitespaces=false --hard_vocab_limit=false"
                             " --normalization_rule_name=identity --minloglevel=2";
    const auto status = sentencepiece::SentencePieceTrainer::Train(args);
    ASSERT_TRUE(status.ok()) << status.ToString();
    fs::rename(*dir_ / "tokenizer.model", *dir_ / "model" / "tokenizer.model");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(processor_.Load((model_dir() / "tokenizer.model").string()).ok());
  }
  static fs::path model_dir() { return *dir_ / "model"; }

  static fs::path* dir_;
  sentencepiece::SentencePieceProcessor processor_;
};

fs::path* SentencePieceModel::dir_ = nullptr;

TEST_F(SentencePieceModel, IdsAndTextAreTheLibrarysOwn) {
  const Tokenizer tokenizer = Tokenizer::from_sentencepiece(model_dir() / "tokenizer.model");
  EXPECT_EQ(tokenizer.vocab_size(), static_cast<std::size_t>(processor_.GetPieceSize()));
  std::size_t compared = 0;
  for (const std::string& text : corpus()) {
    // The library itself reads "<s>" in text as characters; strata (like Hugging Face) as the
    // control piece: ControlPiecesInTextBecomeTheirIds covers those strings.
    if (text.find("<s>") != std::string::npos || text.find("</s>") != std::string::npos) continue;
    SCOPED_TRACE("input (hex) " + test_support::to_hex(text));
    std::vector<int> expected;
    ASSERT_TRUE(processor_.Encode(text, &expected).ok());
    const std::vector<std::int32_t> ids = tokenizer.encode(text);
    ASSERT_EQ(ids, std::vector<std::int32_t>(expected.begin(), expected.end()));
    std::vector<std::int32_t> with_bos = {processor_.bos_id()};
    with_bos.insert(with_bos.end(), ids.begin(), ids.end());
    EXPECT_EQ(tokenizer.encode(text, true), with_bos);
    std::string decoded;
    ASSERT_TRUE(processor_.Decode(expected, &decoded).ok());
    EXPECT_EQ(tokenizer.decode(ids), decoded);
    EXPECT_EQ(tokenizer.decode(with_bos, true), decoded);
    for (const std::int32_t id : ids)
      EXPECT_EQ(tokenizer.id_to_token(id), processor_.IdToPiece(id));
    ++compared;
  }
  EXPECT_GE(compared, 55U);
  std::printf("[ sentencepiece ] %zu strings identical to libsentencepiece's own encode/decode\n",
              compared);
}

TEST_F(SentencePieceModel, ControlPiecesInTextBecomeTheirIds) {
  const Tokenizer tokenizer = Tokenizer::from_sentencepiece(model_dir() / "tokenizer.model");
  std::vector<int> hello;
  ASSERT_TRUE(processor_.Encode("Hello world", &hello).ok());
  std::vector<std::int32_t> expected = {processor_.bos_id()};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(processor_.eos_id());
  EXPECT_EQ(tokenizer.encode("<s>Hello world</s>"), expected);
  EXPECT_EQ(tokenizer.decode(expected), "<s>Hello world</s>");
  EXPECT_EQ(tokenizer.decode(expected, true), "Hello world");
  EXPECT_EQ(tokenizer.token_to_id("<s>"), processor_.bos_id());
  EXPECT_EQ(tokenizer.token_to_id("no-such-piece"), std::nullopt);
  EXPECT_EQ(tokenizer.token_to_id("<unk>"), processor_.unk_id());
}

TEST_F(SentencePieceModel, LoadReadsBosEosAndAddFlagsFromTheFolder) {
  const Tokenizer plain = Tokenizer::load(model_dir());
  EXPECT_EQ(plain.bos_id(), processor_.bos_id());
  EXPECT_EQ(plain.eos_id(), processor_.eos_id());

  test_support::write_file(model_dir() / "tokenizer_config.json",
                           R"({"add_bos_token": false, "add_eos_token": true,
                               "eos_token": {"content": "</s>", "lstrip": false}})");
  test_support::write_file(model_dir() / "special_tokens_map.json", R"({"bos_token": "<unk>"})");
  const Tokenizer configured = Tokenizer::load(model_dir());
  EXPECT_EQ(configured.bos_id(), processor_.unk_id());  // from special_tokens_map.json
  EXPECT_EQ(configured.eos_id(), processor_.eos_id());
  std::vector<int> hello;
  ASSERT_TRUE(processor_.Encode("Hello", &hello).ok());
  std::vector<std::int32_t> expected(hello.begin(), hello.end());
  expected.push_back(processor_.eos_id());
  EXPECT_EQ(configured.encode("Hello", true), expected);
  fs::remove(model_dir() / "tokenizer_config.json");
  fs::remove(model_dir() / "special_tokens_map.json");
}

TEST_F(SentencePieceModel, ABrokenModelFileIsNamed) {
  const fs::path broken = *dir_ / "broken.model";
  test_support::write_file(broken, "this is not a protobuf");
  try {
    (void)Tokenizer::from_sentencepiece(broken);
    FAIL() << "a broken model loaded";
  } catch (const TokenizerError& error) {
    EXPECT_NE(std::string(error.what()).find(broken.string()), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace strata::llm
