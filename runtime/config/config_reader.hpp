// TableReader: reads one TOML table strictly. Every getter declares a key as known, so after all
// reads finish() can reject any key the table holds that nobody asked for, suggesting the nearest
// known one. Errors carry file, line, column and the key's full path.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <toml++/toml.h>

namespace strata::runtime::detail {

// Levenshtein distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

class TableReader {
 public:
  // `path` is the table's dotted path ("tiers.nvme"); empty for the document root.
  TableReader(const toml::table& table, std::string path, std::string file);

  void read_bool(std::string_view key, bool& out);
  void read_double(std::string_view key, double& out, double min, double max);
  // Like read_double, but the value must be strictly greater than `min`.
  void read_positive_double(std::string_view key, double& out, double max);
  void read_uint32(std::string_view key, std::uint32_t& out, std::uint64_t min, std::uint64_t max);
  void read_uint64(std::string_view key, std::uint64_t& out, std::uint64_t min, std::uint64_t max);
  // A signed integer in [min, max] (a negative value may stand for "not set", e.g. index = -1).
  void read_int32(std::string_view key, std::int32_t& out, std::int32_t min, std::int32_t max);
  // An element count: an integer or an integral float such as 1e9.
  void read_count(std::string_view key, std::uint64_t& out, std::uint64_t min, std::uint64_t max);
  // A byte size: a non-negative integer or a size string ("64GiB", "512k"); must be >= min.
  void read_size(std::string_view key, std::uint64_t& out, std::uint64_t min);
  void read_string(std::string_view key, std::string& out);
  void read_string_list(std::string_view key, std::vector<std::string>& out);

  template <typename Enum>
  void read_enum(std::string_view key, Enum& out,
                 std::initializer_list<std::pair<std::string_view, Enum>> choices) {
    std::vector<std::string_view> names;
    for (const auto& choice : choices) names.push_back(choice.first);
    const std::optional<std::size_t> index = read_choice(key, names);
    if (index) out = std::data(choices)[*index].second;
  }

  // The raw node for `key` (declared known), for values the getters above do not cover.
  const toml::node* node(std::string_view key) { return declare(key); }
  // Throws at `where` (a node inside this table) for `key`.
  [[noreturn]] void fail_at(const toml::source_region& where, std::string_view key,
                            const std::string& message) const;

  // The sub-table `key`, if present (an error if present but not a table).
  std::optional<TableReader> table(std::string_view key);

  // Throws for the first key in the table that no getter declared.
  void finish() const;

  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  [[noreturn]] void fail_table(const std::string& message) const;

  std::string key_path(std::string_view key) const;
  const std::string& path() const { return path_; }

 private:
  const toml::node* declare(std::string_view key);
  std::optional<std::size_t> read_choice(std::string_view key,
                                         const std::vector<std::string_view>& names);

  const toml::table* table_;
  std::string path_;
  std::string file_;
  std::vector<std::string> known_keys_;
};

}  // namespace strata::runtime::detail
