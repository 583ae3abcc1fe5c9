// JsonLocation: a node of a parsed tokenizer file together with where it sits (the file and its
// JSON pointer, e.g. "tokenizer.json: /pre_tokenizer/pretokenizers/1/type"), so that every
// complaint about the file names the file and the exact key. Typed getters throw TokenizerError.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "models/tokenizer/tokenizer.hpp"

namespace strata::llm::detail {

class JsonLocation {
 public:
  JsonLocation(const nlohmann::json& node, std::filesystem::path file, std::string pointer = "")
      : node_(&node), file_(std::move(file)), pointer_(std::move(pointer)) {}

  const nlohmann::json& node() const { return *node_; }
  std::string where() const;  // "<file>: <pointer>"

  bool has(std::string_view key) const;         // present and not null
  JsonLocation at(std::string_view key) const;  // required key of an object
  JsonLocation at(std::size_t index) const;     // element of an array
  std::size_t array_size() const;               // contract: throws unless an array

  std::string string() const;
  bool boolean() const;
  std::int64_t integer() const;
  std::string string_or(std::string_view key, std::string_view fallback) const;
  bool boolean_or(std::string_view key, bool fallback) const;
  std::optional<std::string> optional_string(std::string_view key) const;

  [[noreturn]] void fail(const std::string& message) const;
  // The component's "type" string, refusing anything not in `supported` with both lists named.
  std::string type_among(std::initializer_list<std::string_view> supported,
                         std::string_view component) const;

 private:
  const nlohmann::json* node_;
  std::filesystem::path file_;
  std::string pointer_;
};

// Reads and parses a JSON file; a missing file or a syntax error is a TokenizerError naming it.
nlohmann::json read_json_file(const std::filesystem::path& file);

}  // namespace strata::llm::detail
