// libFuzzer target: the safetensors header parser (runtime/checkpoint/safetensors.hpp) on arbitrary files.
// Any input must parse or throw SafetensorsError; a parsed file's tensors must all be readable.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const strata::runtime::SafetensorsFile file = strata::runtime::SafetensorsFile::parse(
        std::vector<std::uint8_t>(data, data + size), "fuzz.safetensors");
    std::vector<float> values;
    for (const strata::runtime::SafetensorsEntry& entry : file.entries()) {
      values.resize((entry.end - entry.begin) / strata::dtype_bytes(entry.dtype));
      file.read_fp32(entry, values);
    }
  } catch (const strata::runtime::SafetensorsError&) {
  }
  return 0;
}
