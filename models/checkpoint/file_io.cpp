#include "models/checkpoint/file_io.hpp"

#include <cstdint>
#include <vector>

#include "io/whole_file.hpp"

namespace strata::llm {

std::string read_text_file(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace strata::llm
