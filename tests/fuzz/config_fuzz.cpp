// libFuzzer target: runtime::parse_config on arbitrary text. Any input must either parse or throw
// a std::exception (ConfigError naming the key); never crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>

#include "runtime/config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const strata::runtime::Config config = strata::runtime::parse_config(text);
    static_cast<void>(config);
  } catch (const std::exception&) {
  }
  return 0;
}
