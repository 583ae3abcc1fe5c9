#include "io/whole_file.hpp"

#include <cerrno>
#include <cstdio>
#include <string>

#include "io/file_handle.hpp"
#include "io/io_error.hpp"

namespace strata::io {
namespace {

// Removes the temporary file of a failed atomic write; a failure to remove it changes nothing
// the caller can act on (the error being raised is the news).
class TemporaryFile {
 public:
  explicit TemporaryFile(std::filesystem::path path) : path_(std::move(path)) {}
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (!kept_) {
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
    }
  }
  const std::filesystem::path& path() const { return path_; }
  void keep() { kept_ = true; }

 private:
  std::filesystem::path path_;
  bool kept_ = false;
};

}  // namespace

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path) {
  const FileHandle file =
      FileHandle::open(path, {CreateMode::kOpenExisting, DirectIo::kOff, Access::kReadOnly});
  if (!file.is_regular_file()) {
    const int error_number = std::filesystem::is_directory(path) ? EISDIR : EINVAL;
    throw IoError("read (not a regular file)", path.string(), 0, 0, error_number);
  }
  std::vector<std::uint8_t> bytes(file.size_bytes());
  const std::size_t got = file.read_at(0, std::as_writable_bytes(std::span(bytes)));
  bytes.resize(got);  // the file shrank under us
  return bytes;
}

void sync_directory(const std::filesystem::path& directory) {
  FileHandle::open_directory(directory).sync();
}

void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> chunks) {
  std::filesystem::path temporary_path = path;
  temporary_path += ".tmp";
  TemporaryFile temporary(temporary_path);
  {
    const FileHandle file =
        FileHandle::open(temporary.path(), {CreateMode::kCreateTruncate, DirectIo::kOff});
    std::uint64_t offset = 0;
    for (const std::span<const std::uint8_t> chunk : chunks) {
      file.write_at(offset, std::as_bytes(chunk));
      offset += chunk.size();
    }
    file.sync();
  }
  if (std::rename(temporary.path().c_str(), path.c_str()) != 0) {
    throw IoError("rename '" + temporary.path().string() + "' to", path.string(), 0, 0, errno);
  }
  temporary.keep();
  sync_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  const std::span<const std::uint8_t> chunks[] = {
      {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}};
  write_file_atomically(path, chunks);
}

}  // namespace strata::io
