#include "runtime/config/config_reader.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "runtime/config/byte_size.hpp"
#include "runtime/config/config.hpp"

namespace strata::runtime::detail {
namespace {

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string join_quoted(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += fmt::format("\"{}\"", names[i]);
  }
  return out;
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const std::size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitution});
      diagonal = above;
    }
  }
  return row[b.size()];
}

TableReader::TableReader(const toml::table& table, std::string path, std::string file)
    : table_(&table), path_(std::move(path)), file_(std::move(file)) {}

std::string TableReader::key_path(std::string_view key) const {
  if (path_.empty()) return std::string(key);
  if (key.empty()) return path_;
  return fmt::format("{}.{}", path_, key);
}

void TableReader::fail_at(const toml::source_region& where, std::string_view key,
                          const std::string& message) const {
  throw ConfigError(file_, where.begin.line, where.begin.column, key_path(key), message);
}

void TableReader::fail(std::string_view key, const std::string& message) const {
  const toml::node* node = table_->get(key);
  fail_at(node != nullptr ? node->source() : table_->source(), key, message);
}

void TableReader::fail_table(const std::string& message) const {
  fail_at(table_->source(), "", message);
}

const toml::node* TableReader::declare(std::string_view key) {
  known_keys_.emplace_back(key);
  return table_->get(key);
}

void TableReader::read_bool(std::string_view key, bool& out) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  const auto value = node->value<bool>();
  if (!node->is_boolean() || !value) {
    fail(key, fmt::format("expected a boolean (true or false), got {}", type_name(*node)));
  }
  out = *value;
}

void TableReader::read_double(std::string_view key, double& out, double min, double max) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  if (!node->is_number()) fail(key, fmt::format("expected a number, got {}", type_name(*node)));
  const double value = *node->value<double>();
  if (!std::isfinite(value) || value < min || value > max) {
    fail(key, fmt::format("value {} is out of range: allowed {} to {}", value, min, max));
  }
  out = value;
}

void TableReader::read_positive_double(std::string_view key, double& out, double max) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  if (!node->is_number()) fail(key, fmt::format("expected a number, got {}", type_name(*node)));
  const double value = *node->value<double>();
  if (!std::isfinite(value) || value <= 0.0 || value > max) {
    fail(key,
         fmt::format("value {} is out of range: allowed greater than 0, up to {}", value, max));
  }
  out = value;
}

void TableReader::read_uint64(std::string_view key, std::uint64_t& out, std::uint64_t min,
                              std::uint64_t max) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  if (!node->is_integer()) fail(key, fmt::format("expected an integer, got {}", type_name(*node)));
  const std::int64_t value = *node->value<std::int64_t>();
  if (value < 0 || static_cast<std::uint64_t>(value) < min ||
      static_cast<std::uint64_t>(value) > max) {
    fail(key, fmt::format("value {} is out of range: allowed {} to {}", value, min, max));
  }
  out = static_cast<std::uint64_t>(value);
}

void TableReader::read_uint32(std::string_view key, std::uint32_t& out, std::uint64_t min,
                              std::uint64_t max) {
  std::uint64_t value = out;
  read_uint64(key, value, min, std::min<std::uint64_t>(max, 0xffff'ffffu));
  out = static_cast<std::uint32_t>(value);
}

void TableReader::read_int32(std::string_view key, std::int32_t& out, std::int32_t min,
                             std::int32_t max) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  if (!node->is_integer()) fail(key, fmt::format("expected an integer, got {}", type_name(*node)));
  const std::int64_t value = *node->value<std::int64_t>();
  if (value < min || value > max) {
    fail(key, fmt::format("value {} is out of range: allowed {} to {}", value, min, max));
  }
  out = static_cast<std::int32_t>(value);
}

void TableReader::read_count(std::string_view key, std::uint64_t& out, std::uint64_t min,
                             std::uint64_t max) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  double value = 0;
  if (node->is_integer()) {
    value = static_cast<double>(*node->value<std::int64_t>());
  } else if (node->is_floating_point()) {
    value = *node->value<double>();
    if (!std::isfinite(value) || value != std::floor(value)) {
      fail(key, fmt::format("expected a whole number of elements, got {}", value));
    }
  } else {
    fail(key, fmt::format("expected a number of elements (e.g. 100000000 or 1e8), got {}",
                          type_name(*node)));
  }
  if (value < static_cast<double>(min) || value > static_cast<double>(max)) {
    fail(key, fmt::format("value {} is out of range: allowed {} to {}", value, min, max));
  }
  out = static_cast<std::uint64_t>(value);
}

void TableReader::read_size(std::string_view key, std::uint64_t& out, std::uint64_t min) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  std::uint64_t bytes = 0;
  if (node->is_integer()) {
    const std::int64_t value = *node->value<std::int64_t>();
    if (value < 0) fail(key, fmt::format("a size cannot be negative, got {}", value));
    bytes = static_cast<std::uint64_t>(value);
  } else if (node->is_string()) {
    const std::string text = *node->value<std::string>();
    const std::optional<std::uint64_t> parsed = parse_byte_size(text);
    if (!parsed) {
      fail(key, fmt::format("\"{}\" is not a size: write bytes as an integer or a number with a "
                            "unit: k, M, G, T (or KiB, MiB, GiB, TiB: powers of 1024), KB, MB, GB, "
                            "TB (powers of 1000), e.g. \"64GiB\"",
                            text));
    }
    bytes = *parsed;
  } else {
    fail(key, fmt::format("expected a size (an integer or a string such as \"64GiB\"), got {}",
                          type_name(*node)));
  }
  if (bytes < min) {
    fail(key, fmt::format("size {} is too small: it must be at least {}",
                          format_binary_bytes(bytes), format_binary_bytes(min)));
  }
  out = bytes;
}

void TableReader::read_string(std::string_view key, std::string& out) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  if (!node->is_string()) fail(key, fmt::format("expected a string, got {}", type_name(*node)));
  out = *node->value<std::string>();
}

void TableReader::read_string_list(std::string_view key, std::vector<std::string>& out) {
  const toml::node* node = declare(key);
  if (node == nullptr) return;
  const toml::array* array = node->as_array();
  if (array == nullptr) {
    fail(key, fmt::format("expected an array of strings, got {}", type_name(*node)));
  }
  std::vector<std::string> values;
  for (const toml::node& element : *array) {
    if (!element.is_string()) {
      fail_at(
          element.source(), key,
          fmt::format("expected an array of strings, but an element is {}", type_name(element)));
    }
    values.push_back(*element.value<std::string>());
    if (values.back().empty()) fail_at(element.source(), key, "an empty string is not a path");
  }
  out = std::move(values);
}

std::optional<std::size_t> TableReader::read_choice(std::string_view key,
                                                    const std::vector<std::string_view>& names) {
  const toml::node* node = declare(key);
  if (node == nullptr) return std::nullopt;
  if (!node->is_string()) {
    fail(key, fmt::format("expected one of {}, got {}", join_quoted(names), type_name(*node)));
  }
  const std::string value = *node->value<std::string>();
  const auto found = std::find(names.begin(), names.end(), value);
  if (found == names.end()) {
    fail(key, fmt::format("\"{}\" is not allowed: expected one of {}", value, join_quoted(names)));
  }
  return static_cast<std::size_t>(found - names.begin());
}

std::optional<TableReader> TableReader::table(std::string_view key) {
  const toml::node* node = declare(key);
  if (node == nullptr) return std::nullopt;
  const toml::table* sub = node->as_table();
  if (sub == nullptr) {
    fail(key, fmt::format("expected a table ([{}]), got {}", key_path(key), type_name(*node)));
  }
  return TableReader(*sub, key_path(key), file_);
}

void TableReader::finish() const {
  for (const auto& [key, node] : *table_) {
    static_cast<void>(node);
    const std::string_view name = key.str();
    if (std::find(known_keys_.begin(), known_keys_.end(), name) != known_keys_.end()) continue;
    std::string nearest;
    std::size_t best = std::numeric_limits<std::size_t>::max();
    for (const std::string& known : known_keys_) {
      const std::size_t distance = edit_distance(name, known);
      if (distance < best) {
        best = distance;
        nearest = known;
      }
    }
    std::vector<std::string_view> allowed(known_keys_.begin(), known_keys_.end());
    std::string message = path_.empty() ? fmt::format("unknown section or key \"{}\"", name)
                                        : fmt::format("unknown key \"{}\" in [{}]", name, path_);
    if (!nearest.empty() && best <= std::max<std::size_t>(2, nearest.size() / 3)) {
      message += fmt::format("; did you mean \"{}\"?", nearest);
    }
    message += fmt::format(" (allowed: {})", join_quoted(allowed));
    fail_at(key.source(), name, message);
  }
}

}  // namespace strata::runtime::detail
