// Files for checkpoint input, on io/'s one file layer (io::FileHandle, io/whole_file.hpp): a
// read-only file read by byte range (pread), so a loader touches only the bytes it needs, and small
// whole files as text. Errors are io::IoError naming the operation, the path, the offset and the
// length. Outputs are written with io::AtomicFileWriter (io/whole_file.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "io/file_handle.hpp"

namespace strata::llm {

// Move-only; closes its descriptor quietly.
class ReadOnlyFile {
 public:
  static ReadOnlyFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  std::uint64_t size_bytes() const { return size_bytes_; }
  // Exactly out.size() bytes from `offset` (EOF before the end throws io::IoError with EIO).
  void read_exact(std::uint64_t offset, std::span<std::byte> out) const;

 private:
  ReadOnlyFile(std::filesystem::path path, io::FileHandle file, std::uint64_t size_bytes);
  std::filesystem::path path_;
  io::FileHandle file_;
  std::uint64_t size_bytes_ = 0;
};

// A whole small file (config.json, an index) as text.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace strata::llm
