#include "runtime/config/byte_size.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "base/units.hpp"

namespace strata::runtime {
namespace {

struct Suffix {
  std::string_view text;
  std::uint64_t multiplier;
};

constexpr std::array kSuffixes = {
    Suffix{"", 1},
    Suffix{"B", 1},
    Suffix{"k", kKiB},
    Suffix{"K", kKiB},
    Suffix{"KiB", kKiB},
    Suffix{"m", kMiB},
    Suffix{"M", kMiB},
    Suffix{"MiB", kMiB},
    Suffix{"g", kGiB},
    Suffix{"G", kGiB},
    Suffix{"GiB", kGiB},
    Suffix{"t", kTiB},
    Suffix{"T", kTiB},
    Suffix{"TiB", kTiB},
    Suffix{"KB", 1000},
    Suffix{"MB", 1000'000},
    Suffix{"GB", 1000'000'000},
    Suffix{"TB", 1000'000'000'000},
};

}  // namespace

std::optional<std::uint64_t> parse_byte_size(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  std::size_t number_end = 0;
  while (number_end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[number_end])) || text[number_end] == '.')) {
    ++number_end;
  }
  if (number_end == 0) return std::nullopt;
  std::string_view number = text.substr(0, number_end);
  std::string_view suffix = text.substr(number_end);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);

  std::uint64_t multiplier = 0;
  for (const Suffix& candidate : kSuffixes) {
    if (candidate.text == suffix) multiplier = candidate.multiplier;
  }
  if (multiplier == 0) return std::nullopt;

  if (number.find('.') == std::string_view::npos) {
    std::uint64_t value = 0;
    auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (error != std::errc{} || end != number.data() + number.size()) return std::nullopt;
    if (value > std::numeric_limits<std::uint64_t>::max() / multiplier) return std::nullopt;
    return value * multiplier;
  }
  double value = 0;
  auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (error != std::errc{} || end != number.data() + number.size()) return std::nullopt;
  const double bytes = value * static_cast<double>(multiplier);
  if (!(bytes < 1.8e19) || bytes != std::floor(bytes)) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

std::string format_binary_bytes(std::uint64_t bytes) {
  constexpr std::array<std::string_view, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

std::string format_decimal_bytes(double bytes) {
  constexpr std::array<std::string_view, 5> kUnits = {"B", "kB", "MB", "GB", "TB"};
  std::size_t unit = 0;
  while (std::fabs(bytes) >= 1000.0 && unit + 1 < kUnits.size()) {
    bytes /= 1000.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.1f} {}", bytes, kUnits[unit]);
}

}  // namespace strata::runtime
