#include "models/checkpoint/file_io.hpp"

#include <cerrno>
#include <utility>
#include <vector>

#include "io/io_error.hpp"
#include "io/whole_file.hpp"

namespace strata::llm {

ReadOnlyFile ReadOnlyFile::open(const std::filesystem::path& path) {
  io::FileHandle file = io::FileHandle::open(
      path, {io::CreateMode::kOpenExisting, io::DirectIo::kOff, io::Access::kReadOnly});
  if (!file.is_regular_file()) throw io::IoError("open (not a regular file)", path.string(), 0, 0, EISDIR);
  const std::uint64_t size_bytes = file.size_bytes();
  return ReadOnlyFile(path, std::move(file), size_bytes);
}

ReadOnlyFile::ReadOnlyFile(std::filesystem::path path, io::FileHandle file,
                           std::uint64_t size_bytes)
    : path_(std::move(path)), file_(std::move(file)), size_bytes_(size_bytes) {}

void ReadOnlyFile::read_exact(std::uint64_t offset, std::span<std::byte> out) const {
  const std::size_t got = file_.read_at(offset, out);
  if (got != out.size()) {
    throw io::IoError("read (end of file)", path_.string(), offset + got, out.size() - got, EIO);
  }
}

std::string read_text_file(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace strata::llm
