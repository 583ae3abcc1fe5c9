// Proves the data path: packing into seq_len + 1 windows (a short last window padded at weight 0),
// text documents separated by eos, loss weights only on completions and assistant turns under
// each family's chat template (rendered exactly as documented), malformed lines named by file and
// line, and a seeded order that is a pure function of (seed, step): resumes draw the same batch.
#include "models/training/training_data.hpp"

#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "models/training/chat_template.hpp"
#include "models/training/data_loader.hpp"
#include "tests/models/llm/llm_io_test_support.hpp"

namespace strata::llm {
namespace {

using testing::ScratchDir;

TEST(PackWindows, BackToBackWindowsAndAPaddedShortLastOne) {
  TokenStream stream;
  const std::vector<std::int32_t> ids = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  stream.append(std::span(ids).first(6), true);
  stream.append(std::span(ids).subspan(6), false);
  const PackedWindows packed = pack_windows(stream, 4, /*pad_id=*/99);
  ASSERT_EQ(packed.count(), 3u);
  EXPECT_EQ(std::vector<std::int32_t>(packed.window(2).begin(), packed.window(2).end()),
            (std::vector<std::int32_t>{18, 19, 99, 99}));
  // Targets 11..13 trained; 15 trained, 16 and 17 not; 19 not, then padding.
  EXPECT_EQ(std::vector<float>(packed.weights.begin(), packed.weights.end()),
            (std::vector<float>{1, 1, 1, 1, 0, 0, 0, 0, 0}));
  stream.append(std::vector<std::int32_t>{20, 21, 22}, true);  // 13 tokens: last window of 1
  EXPECT_EQ(pack_windows(stream, 4, 99).count(), 3u);
  stream.append(std::vector<std::int32_t>{23, 24, 25}, true);  // 16: exactly four windows
  EXPECT_EQ(pack_windows(stream, 4, 99).count(), 4u);
  stream.append(std::vector<std::int32_t>{26, 27}, true);      // 18: a last window of 2 counts
  EXPECT_EQ(pack_windows(stream, 4, 99).count(), 5u);
}

class DataTest : public ::testing::Test {
 protected:
  void use_family(Family family) {
    TinyModelOptions options;
    options.family = family;
    dir_ = scratch_.path() / std::string(family_name(family));
    write_tiny_model(dir_, options);
    tokenizer_.emplace(Tokenizer::load(dir_));
    const HfConfig config = read_hf_config(dir_ / "config.json");
    source_ = {&*tokenizer_, family, config.eos_token_ids.front()};
  }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    const std::filesystem::path path = scratch_.path() / name;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path;
  }
  // The text of the tokens with weight `trained`.
  std::string text_of(const TokenStream& stream, bool trained) const {
    std::vector<std::int32_t> ids;
    for (std::size_t i = 0; i < stream.size(); ++i) {
      if ((stream.trained[i] != 0) == trained) ids.push_back(stream.tokens[i]);
    }
    return tokenizer_->decode(ids);
  }
  std::string jsonl_error(const std::string& lines) {
    const std::filesystem::path path = write("bad.jsonl", lines);
    try {
      read_training_data({path}, source_);
    } catch (const DataError& error) {
      return error.what();
    }
    return "no error";
  }

  ScratchDir scratch_;
  std::filesystem::path dir_;
  std::optional<Tokenizer> tokenizer_;
  DataSource source_;
};

TEST_F(DataTest, TextFilesAreDocumentsSeparatedByEosInPathOrder) {
  use_family(Family::kLlama);
  write("corpus/b.txt", "the second");
  write("corpus/a.txt", "the first");
  write("corpus/.hidden", "never read");
  const TokenStream stream = read_training_data({scratch_.path() / "corpus"}, source_);
  const std::int32_t bos = *tokenizer_->token_to_id("<|begin_of_text|>");
  std::vector<std::int32_t> expected = {bos};
  for (const char* text : {"the first", "the second"}) {
    if (expected.size() > 1) expected.push_back(bos);
    const std::vector<std::int32_t> ids = tokenizer_->encode(text);
    expected.insert(expected.end(), ids.begin(), ids.end());
    expected.push_back(source_.eos_id);
  }
  EXPECT_EQ(stream.tokens, expected);
  EXPECT_EQ(text_of(stream, false), "<|begin_of_text|><|begin_of_text|>");  // only the bos
}

TEST_F(DataTest, PromptCompletionTrainsOnlyTheCompletionAndEos) {
  use_family(Family::kQwen2);
  const std::filesystem::path path = write(
      "pc.jsonl", R"({"prompt": "the question: ", "completion": "the answer"})" "\n\n"
                  R"({"text": "in the end"})" "\n");
  const TokenStream stream = read_training_data({path}, source_);
  EXPECT_EQ(text_of(stream, true), "the answer<|endoftext|>in the end<|endoftext|>");
  EXPECT_EQ(text_of(stream, false), "the question: ");
}

struct TemplateCase {
  Family family;
  const char* rendered;  // the documented template, written out
  const char* trained;   // what the loss sees
};

class ChatTemplate : public DataTest, public ::testing::WithParamInterface<TemplateCase> {};

TEST_P(ChatTemplate, RendersAsDocumentedAndTrainsOnlyAssistantTurns) {
  use_family(GetParam().family);
  const std::filesystem::path path = write(
      "chat.jsonl",
      R"({"messages": [{"role": "system", "content": "be brief"},)"
      R"( {"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"},)"
      R"( {"role": "user", "content": "and then"}, {"role": "assistant", "content": "the end"}]})"
      "\n");
  const TokenStream stream = read_training_data({path}, source_);
  EXPECT_EQ(tokenizer_->decode(stream.tokens), GetParam().rendered);
  EXPECT_EQ(text_of(stream, true), GetParam().trained);
}

INSTANTIATE_TEST_SUITE_P(
    Data, ChatTemplate,
    ::testing::Values(
        TemplateCase{Family::kLlama,
                     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief"
                     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nand then<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nthe end<|eot_id|>",
                     "hello<|eot_id|>the end<|eot_id|>"},
        TemplateCase{Family::kQwen2,
                     "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi there"
                     "<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\n"
                     "and then<|im_end|>\n<|im_start|>assistant\nthe end<|im_end|>\n",
                     "hello<|im_end|>the end<|im_end|>"},
        TemplateCase{Family::kMistral,
                     "<s>[INST] be brief\n\nhi there [/INST]hello</s>[INST] and then [/INST]"
                     "the end</s>",
                     "hello</s>the end</s>"},
        TemplateCase{Family::kGpt2, "be briefhi therehelloand thenthe end<|endoftext|>",
                     "hellothe end<|endoftext|>"}),
    [](const auto& test_case) { return std::string(family_name(test_case.param.family)); });

TEST_F(DataTest, MalformedLinesAreNamedByFileAndLine) {
  use_family(Family::kLlama);
  const std::string good = R"({"text": "fine"})";
  EXPECT_NE(jsonl_error(good + "\n" + good + "\n{\"text\": \"cut off\n").find("bad.jsonl:3: malformed JSON"),
            std::string::npos);
  EXPECT_NE(jsonl_error(good + "\n{\"body\": \"x\"}\n").find("bad.jsonl:2: no \"text\""),
            std::string::npos);
  EXPECT_NE(jsonl_error("{\"text\": 7}\n").find("bad.jsonl:1: \"text\" must be a string"),
            std::string::npos);
  EXPECT_NE(jsonl_error("{\"prompt\": \"p\"}\n").find("bad.jsonl:1: \"prompt\" and \"completion\""),
            std::string::npos);
  EXPECT_NE(jsonl_error(R"({"messages": [{"role": "robot", "content": "x"}]})" "\n")
                .find("bad.jsonl:1: messages[0]: unknown role \"robot\""),
            std::string::npos);
  EXPECT_NE(jsonl_error("[1, 2]\n").find("bad.jsonl:1: a line must be a JSON object"),
            std::string::npos);
}

TEST_F(DataTest, MistralRefusesConversationsItsTemplateCannotExpress) {
  use_family(Family::kMistral);
  const std::string error = jsonl_error(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})" "\n");
  EXPECT_NE(error.find("bad.jsonl:1: Mistral's template"), std::string::npos) << error;
}

PackedWindows numbered_windows(std::size_t count) {
  TokenStream stream;
  for (std::size_t i = 0; i < count * 3; ++i) {
    stream.append(std::vector<std::int32_t>{static_cast<std::int32_t>(i)}, true);
  }
  return pack_windows(stream, 3, 0);
}

TEST(DataLoader, OrderIsAPureFunctionOfSeedAndStep) {
  const DataLoader loader(numbered_windows(40), 4, /*seed=*/7);
  EXPECT_EQ(loader.train_windows(), 38u);  // the last ceil(40 / 20) windows are validation
  EXPECT_EQ(loader.validation_windows(), 2u);
  Batch batch;
  std::vector<Batch> uninterrupted;
  for (std::uint64_t index = 0; index < 30; ++index) {
    loader.train_batch(index, batch);
    uninterrupted.push_back(batch);
  }
  // A resumed run: a fresh loader asked for step 23 first gives what the long run drew there.
  const DataLoader resumed(numbered_windows(40), 4, 7);
  for (std::uint64_t index = 23; index < 30; ++index) {
    resumed.train_batch(index, batch);
    EXPECT_EQ(batch.tokens, uninterrupted[index].tokens) << "micro-batch " << index;
  }
  const DataLoader other_seed(numbered_windows(40), 4, 8);
  other_seed.train_batch(0, batch);
  EXPECT_NE(batch.tokens, uninterrupted[0].tokens);
  // Each epoch visits every training window once, never a validation window.
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<std::size_t> seen;
    for (std::uint64_t k = epoch * 38; k < (epoch + 1) * 38; ++k) {
      seen.insert(loader.train_window_of(k));
    }
    EXPECT_EQ(seen.size(), 38u);
    EXPECT_EQ(*seen.rbegin(), 37u);
  }
}

TEST(DataLoader, RanksDrawDisjointWindowsWithinAnEpoch) {
  const DataLoader rank0(numbered_windows(40), 2, 3, /*ranks=*/2, /*rank=*/0);
  const DataLoader rank1(numbered_windows(40), 2, 3, 2, 1);
  std::set<std::int32_t> first_tokens;
  Batch batch;
  for (std::uint64_t index = 0; index < 9; ++index) {  // 9 × 2 ranks × 2 = 36 < 38 windows
    for (const DataLoader* loader : {&rank0, &rank1}) {
      loader->train_batch(index, batch);
      for (std::size_t s = 0; s < batch.sequences; ++s) {
        EXPECT_TRUE(first_tokens.insert(batch.tokens[s * 3]).second);
      }
    }
  }
}

}  // namespace
}  // namespace strata::llm
