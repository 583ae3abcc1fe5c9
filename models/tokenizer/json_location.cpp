#include "models/tokenizer/json_location.hpp"

#include <fstream>
#include <sstream>

namespace strata::llm::detail {
namespace {

// JSON pointer escaping (RFC 6901) so that keys with '/' or '~' stay unambiguous.
std::string escape_pointer_token(std::string_view key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string JsonLocation::where() const {
  return file_.string() + ": " + (pointer_.empty() ? std::string("/") : pointer_);
}

void JsonLocation::fail(const std::string& message) const {
  throw TokenizerError(where() + ": " + message);
}

bool JsonLocation::has(std::string_view key) const {
  if (!node_->is_object()) return false;
  const auto it = node_->find(key);
  return it != node_->end() && !it->is_null();
}

JsonLocation JsonLocation::at(std::string_view key) const {
  const std::string pointer = pointer_ + "/" + escape_pointer_token(key);
  if (!node_->is_object()) fail("expected an object with key '" + std::string(key) + "'");
  const auto it = node_->find(key);
  if (it == node_->end()) throw TokenizerError(file_.string() + ": " + pointer + ": missing key");
  return JsonLocation(*it, file_, pointer);
}

JsonLocation JsonLocation::at(std::size_t index) const {
  if (!node_->is_array() || index >= node_->size()) fail("no element " + std::to_string(index));
  return JsonLocation((*node_)[index], file_, pointer_ + "/" + std::to_string(index));
}

std::size_t JsonLocation::array_size() const {
  if (!node_->is_array()) fail("expected an array, found " + std::string(node_->type_name()));
  return node_->size();
}

std::string JsonLocation::string() const {
  if (!node_->is_string()) fail("expected a string, found " + std::string(node_->type_name()));
  return node_->get<std::string>();
}

bool JsonLocation::boolean() const {
  if (!node_->is_boolean())
    fail("expected true or false, found " + std::string(node_->type_name()));
  return node_->get<bool>();
}

std::int64_t JsonLocation::integer() const {
  if (!node_->is_number_integer()) {
    fail("expected an integer, found " + std::string(node_->type_name()));
  }
  return node_->get<std::int64_t>();
}

std::string JsonLocation::string_or(std::string_view key, std::string_view fallback) const {
  return has(key) ? at(key).string() : std::string(fallback);
}

bool JsonLocation::boolean_or(std::string_view key, bool fallback) const {
  return has(key) ? at(key).boolean() : fallback;
}

std::optional<std::string> JsonLocation::optional_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return at(key).string();
}

std::string JsonLocation::type_among(std::initializer_list<std::string_view> supported,
                                     std::string_view component) const {
  const std::string type = at("type").string();
  std::string names;
  for (const std::string_view name : supported) {
    if (name == type) return type;
    names += names.empty() ? "" : ", ";
    names += name;
  }
  at("type").fail("unsupported " + std::string(component) + " '" + type +
                  "' (strata supports: " + names + ")");
}

nlohmann::json read_json_file(const std::filesystem::path& file) {
  std::ifstream stream(file, std::ios::binary);
  if (!stream) throw TokenizerError(file.string() + ": cannot open for reading");
  std::ostringstream text;
  text << stream.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& error) {
    throw TokenizerError(file.string() + ": not valid JSON (byte " + std::to_string(error.byte) +
                         "): " + error.what());
  }
}

}  // namespace strata::llm::detail
