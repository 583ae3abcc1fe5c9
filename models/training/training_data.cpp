#include "models/training/training_data.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "models/training/chat_template.hpp"
#include "models/checkpoint/file_io.hpp"

namespace strata::llm {
namespace {

const std::string& string_field(const nlohmann::json& object, const char* key,
                                const std::string& where) {
  const nlohmann::json& value = object.at(key);
  if (!value.is_string()) {
    throw DataError(where + ": \"" + key + "\" must be a string, got " + value.dump());
  }
  return value.get_ref<const std::string&>();
}

void append_document_start(const DataSource& source, TokenStream& stream) {
  stream.append(source.tokenizer->encode("", /*add_special_tokens=*/true), false);
}

void append_text(std::string_view text, bool trained, const DataSource& source,
                 TokenStream& stream) {
  stream.append(source.tokenizer->encode(text), trained);
}

void append_eos(const DataSource& source, TokenStream& stream) {
  const std::int32_t eos = source.eos_id;
  stream.append(std::span<const std::int32_t>(&eos, 1), true);
}

ChatMessage::Role parse_role(const std::string& role, const std::string& where) {
  if (role == "system") return ChatMessage::Role::kSystem;
  if (role == "user") return ChatMessage::Role::kUser;
  if (role == "assistant") return ChatMessage::Role::kAssistant;
  throw DataError(where + ": unknown role \"" + role +
                  "\" (allowed: \"system\", \"user\", \"assistant\")");
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& messages, const std::string& where) {
  if (!messages.is_array() || messages.empty()) {
    throw DataError(where + ": \"messages\" must be a non-empty array");
  }
  std::vector<ChatMessage> parsed;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string at = where + ": messages[" + std::to_string(i) + "]";
    const nlohmann::json& message = messages[i];
    if (!message.is_object() || !message.contains("role") || !message.contains("content")) {
      throw DataError(at + ": must be an object with \"role\" and \"content\"");
    }
    parsed.push_back({parse_role(string_field(message, "role", at), at),
                      string_field(message, "content", at)});
  }
  return parsed;
}

void append_chat(const std::vector<ChatMessage>& messages, const std::string& where,
                 const DataSource& source, TokenStream& stream) {
  for (const std::string& token : chat_special_tokens(source.family)) {
    if (!source.tokenizer->token_to_id(token)) {
      throw DataError(where + ": the " + std::string(family_name(source.family)) +
                      " chat template needs the token " + token + ", which the tokenizer lacks");
    }
  }
  std::vector<TextSegment> segments;
  try {
    segments = render_chat(source.family, messages);
  } catch (const std::invalid_argument& error) {
    throw DataError(where + ": " + error.what());
  }
  for (const TextSegment& segment : segments) {
    append_text(segment.text, segment.trained, source, stream);
  }
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

void read_jsonl_file(const std::filesystem::path& path, const DataSource& source,
                     TokenStream& stream) {
  std::ifstream in(path);
  if (!in) throw DataError(path.string() + ": cannot open for reading");
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (is_blank(line)) continue;
    append_jsonl_example(line, path.string() + ":" + std::to_string(number), source, stream);
  }
}

}  // namespace

void append_jsonl_example(std::string_view line, const std::string& where,
                          const DataSource& source, TokenStream& stream) {
  nlohmann::json example;
  try {
    example = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& error) {
    throw DataError(where + ": malformed JSON: " + error.what());
  }
  if (!example.is_object()) throw DataError(where + ": a line must be a JSON object");
  if (example.contains("messages")) {
    append_chat(parse_messages(example["messages"], where), where, source, stream);
  } else if (example.contains("prompt") || example.contains("completion")) {
    if (!example.contains("prompt") || !example.contains("completion")) {
      throw DataError(where + ": \"prompt\" and \"completion\" go together; one is missing");
    }
    append_document_start(source, stream);
    append_text(string_field(example, "prompt", where), false, source, stream);
    append_text(string_field(example, "completion", where), true, source, stream);
    append_eos(source, stream);
  } else if (example.contains("text")) {
    append_document_start(source, stream);
    append_text(string_field(example, "text", where), true, source, stream);
    append_eos(source, stream);
  } else {
    throw DataError(where +
                    ": no \"text\", \"prompt\"/\"completion\" or \"messages\" key in the object");
  }
}

std::vector<std::filesystem::path> list_data_files(
    const std::vector<std::filesystem::path>& inputs) {
  std::vector<std::filesystem::path> files;
  for (const std::filesystem::path& input : inputs) {
    if (std::filesystem::is_regular_file(input)) {
      files.push_back(input);
    } else if (std::filesystem::is_directory(input)) {
      std::vector<std::filesystem::path> found;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(input)) {
        const std::string name = entry.path().filename().string();
        if (entry.is_regular_file() && !name.starts_with(".")) found.push_back(entry.path());
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      throw DataError(input.string() + ": no such file or folder");
    }
  }
  return files;
}

TokenStream read_training_data(const std::vector<std::filesystem::path>& inputs,
                               const DataSource& source) {
  TokenStream stream;
  for (const std::filesystem::path& file : list_data_files(inputs)) {
    if (file.extension() == ".jsonl") {
      read_jsonl_file(file, source, stream);
    } else {
      append_document_start(source, stream);
      append_text(read_text_file(file), true, source, stream);
      append_eos(source, stream);
    }
  }
  return stream;
}

}  // namespace strata::llm
