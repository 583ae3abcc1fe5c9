// Training data read into one TokenStream, in input order (folders: their regular files, sorted
// by path, recursively; hidden files skipped):
//   - `*.jsonl`: one example per line (blank lines skipped), by key:
//       {"text": "..."}                            a document, every token trained
//       {"prompt": "...", "completion": "..."}     only the completion (and eos) trained
//       {"messages": [{"role", "content"}, ...]}   the family's chat template (chat_template.hpp),
//                                                  only assistant turns trained
//     roles are "system", "user", "assistant". A line that is not JSON, lacks these keys or
//     holds a wrong type is a DataError naming the file and the line.
//   - any other file: one plain-text document.
// A document or prompt is preceded by what the tokenizer's post-processor puts first (Llama's
// <|begin_of_text|> / <s>; nothing for GPT-2 and Qwen2), not trained, and followed by eos,
// trained: documents are separated by eos.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "models/decoder/hf_config.hpp"
#include "models/training/token_stream.hpp"
#include "models/tokenizer/tokenizer.hpp"

namespace strata::llm {

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DataSource {
  const Tokenizer* tokenizer = nullptr;
  Family family = Family::kLlama;
  std::int32_t eos_id = 0;
};

// The files `inputs` name, folders expanded; a path that does not exist is a DataError.
std::vector<std::filesystem::path> list_data_files(const std::vector<std::filesystem::path>& inputs);

TokenStream read_training_data(const std::vector<std::filesystem::path>& inputs,
                               const DataSource& source);

// One JSONL line appended to `stream`; `where` ("file:line") names it in errors.
void append_jsonl_example(std::string_view line, const std::string& where,
                          const DataSource& source, TokenStream& stream);

}  // namespace strata::llm
