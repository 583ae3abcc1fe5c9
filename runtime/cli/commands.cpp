#include "runtime/cli/commands.hpp"

#include <cmath>
#include <exception>
#include <iostream>

namespace strata::cli {

std::optional<runtime::Config> load_config_or_report(const std::string& path,
                                                     std::string_view command) {
  try {
    return runtime::load_config(path);
  } catch (const runtime::ConfigError& error) {
    std::cerr << command << ": bad config: " << error.what() << "\n";
    return std::nullopt;
  }
}

std::optional<std::uint64_t> parse_whole_count(const std::string& text, double max) {
  double value = 0;
  std::size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !(value >= 1) || value > max || value != std::floor(value)) {
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(value);
}

}  // namespace strata::cli
