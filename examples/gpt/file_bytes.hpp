// Whole-file reads and atomic whole-file writes for the GPT example's data and checkpoints.
// Failures throw FileError (a std::system_error) naming the operation, the path and errno's text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace strata::gpt {

class FileError : public std::system_error {
 public:
  FileError(int error_number, const std::string& operation, std::filesystem::path path);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Every byte of the file at `path`.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path);

// Writes `chunks`, in order, to `path` + ".tmp", fsyncs, then renames it over `path`: a reader
// sees the old file or the complete new one, never a torn one.
void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> chunks);

}  // namespace strata::gpt
