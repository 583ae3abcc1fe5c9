// libFuzzer target: strata's one safetensors header parser (runtime/checkpoint/safetensors.hpp) on
// arbitrary files, under both rules (strata's own files, any Hugging Face checkpoint). Any input
// must parse or throw SafetensorsError; a parsed file's tensors must all be read or refused with it.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/checkpoint/safetensors.hpp"

namespace {

void parse_and_read(const std::uint8_t* data, std::size_t size,
                    strata::runtime::SafetensorsRules rules) {
  try {
    const strata::runtime::SafetensorsFile file = strata::runtime::SafetensorsFile::parse(
        std::vector<std::uint8_t>(data, data + size), "fuzz.safetensors", rules);
    std::vector<float> values;
    for (const strata::runtime::SafetensorsEntry& entry : file.entries()) {
      values.resize(entry.numel());
      try {
        file.read_fp32(entry, values);
      } catch (const strata::runtime::SafetensorsError&) {
        // a dtype listed but not convertible (kAnyCheckpoint only); the next entry still reads
      }
    }
  } catch (const strata::runtime::SafetensorsError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  parse_and_read(data, size, strata::runtime::SafetensorsRules::kStrataFile);
  parse_and_read(data, size, strata::runtime::SafetensorsRules::kAnyCheckpoint);
  return 0;
}
