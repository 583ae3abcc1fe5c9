// Helpers shared by the tokenizer tests: a fresh scratch folder per test, files, hex.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace strata::llm::test_support {

// STRATA_TEST_TMPDIR/<name>-<pid>, emptied; tests in separate processes never share one.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const char* root = std::getenv("STRATA_TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(root != nullptr ? root : "/tmp") /
                                    (name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& file, std::string_view text) {
  std::ofstream stream(file, std::ios::binary);
  stream << text;
}

inline std::string read_file(const std::filesystem::path& file) {
  std::ifstream stream(file, std::ios::binary);
  std::ostringstream text;
  text << stream.rdbuf();
  return text.str();
}

inline std::string from_hex(std::string_view hex) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return bytes;
}

inline std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (const char c : bytes) {
    hex.push_back(kDigits[static_cast<unsigned char>(c) >> 4U]);
    hex.push_back(kDigits[static_cast<unsigned char>(c) & 0xFU]);
  }
  return hex;
}

}  // namespace strata::llm::test_support
