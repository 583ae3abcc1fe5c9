#include "examples/llm/file_io.hpp"

#include <cerrno>
#include <cstdio>
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

OutputFile OutputFile::create(const std::filesystem::path& path) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  io::FileHandle file =
      io::FileHandle::open(temporary, {io::CreateMode::kCreateTruncate, io::DirectIo::kOff});
  return OutputFile(path, std::move(temporary), std::move(file));
}

OutputFile::OutputFile(std::filesystem::path path, std::filesystem::path temporary,
                       io::FileHandle file)
    : path_(std::move(path)), temporary_(std::move(temporary)), file_(std::move(file)) {}

OutputFile::~OutputFile() {
  if (file_.valid()) {
    file_ = io::FileHandle();
    std::error_code ignored;
    std::filesystem::remove(temporary_, ignored);
  }
}

void OutputFile::write(std::span<const std::byte> bytes) {
  file_.write_at(written_bytes_, bytes);
  written_bytes_ += bytes.size();
}

void OutputFile::commit() {
  file_.sync();
  file_ = io::FileHandle();
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error_number = errno;
    std::error_code ignored;
    std::filesystem::remove(temporary_, ignored);
    throw io::IoError("rename '" + temporary_.string() + "' to", path_.string(), 0, 0,
                      error_number);
  }
  io::sync_directory(path_.has_parent_path() ? path_.parent_path() : ".");
}

std::string read_text_file(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace strata::llm
