// The debug environment knobs, parsed in one place with one rule per kind of value, so a knob
// means the same in every layer and a mistyped value is an error instead of a silent "off".
//
//   STRATA_FORCE_NVME=1      the Engine homes every state kind on NVMe (whole-suite re-run)
//   STRATA_GATHERS_AT_USE=1  several ranks: every all-gather runs when its unit is needed
//   STRATA_POISON=1          released device buffers and pinned slabs are filled with 0xFF (NaN)
//   STRATA_POISON_BUFFERS=1  buffers returned to an io::BufferPool are filled with 0xDE
//   STRATA_TEST_SEED=<n>     the seed of the randomised tests (printed on failure)
//   STRATA_CRASH_SEED=<n>    the seed of the crash-recovery test (printed on failure)
//   STRATA_TEST_TMPDIR=<dir> where tests and forced-NVMe runs put their files (default /tmp)
//
// Rules: a flag is off when unset, empty or "0" and on when "1"; a seed is unset when the variable
// is unset or empty, else decimal digits that fit 64 bits. Anything else throws KnobError naming
// the variable, its value and what is allowed. docs/design.md lists the knobs.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace strata {

class KnobError : public std::invalid_argument {
 public:
  KnobError(std::string_view name, std::string_view value, std::string_view allowed)
      : std::invalid_argument(std::string(name) + "=\"" + std::string(value) +
                              "\" is not a valid value: " + std::string(allowed)) {}
};

namespace knobs {

// The variable's value; nullopt when it is unset or empty.
inline std::optional<std::string_view> raw(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  return std::string_view(value);
}

inline bool flag(const char* name) {
  const std::optional<std::string_view> value = raw(name);
  if (!value || *value == "0") return false;
  if (*value == "1") return true;
  throw KnobError(name, *value, "0 or 1 (unset or empty is 0)");
}

inline std::optional<std::uint64_t> unsigned_value(const char* name) {
  const std::optional<std::string_view> value = raw(name);
  if (!value) return std::nullopt;
  const bool digits_only = value->find_first_not_of("0123456789") == std::string_view::npos;
  const std::string text(*value);
  errno = 0;
  const unsigned long long parsed = std::strtoull(text.c_str(), nullptr, 10);
  if (!digits_only || errno == ERANGE) {
    throw KnobError(name, *value, "a decimal number below 2^64");
  }
  return parsed;
}

}  // namespace knobs

inline bool force_nvme_knob() {
  return knobs::flag("STRATA_FORCE_NVME");
}
// Benchmarks: every all-gather at use (EngineOptions::gathers_ahead_across_ranks = false), to
// time gathers started ahead against them from the command line.
inline bool gathers_at_use_knob() {
  return knobs::flag("STRATA_GATHERS_AT_USE");
}
inline bool poison_device_knob() {
  return knobs::flag("STRATA_POISON");
}
inline bool poison_io_buffers_knob() {
  return knobs::flag("STRATA_POISON_BUFFERS");
}
inline std::optional<std::uint64_t> test_seed_knob() {
  return knobs::unsigned_value("STRATA_TEST_SEED");
}
inline std::optional<std::uint64_t> crash_seed_knob() {
  return knobs::unsigned_value("STRATA_CRASH_SEED");
}
inline std::filesystem::path test_tmpdir_knob() {
  return std::filesystem::path(knobs::raw("STRATA_TEST_TMPDIR").value_or("/tmp"));
}

}  // namespace strata
