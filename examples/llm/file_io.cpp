#include "examples/llm/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "runtime/safetensors.hpp"

namespace strata::llm {

using runtime::FileError;

ReadOnlyFile ReadOnlyFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw FileError(errno, "open for reading", path);
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    const int error_number = S_ISDIR(info.st_mode) ? EISDIR : (errno != 0 ? errno : EINVAL);
    ::close(fd);
    throw FileError(error_number, "open (not a regular file)", path);
  }
  return ReadOnlyFile(path, fd, static_cast<std::uint64_t>(info.st_size));
}

ReadOnlyFile::ReadOnlyFile(std::filesystem::path path, int fd, std::uint64_t size_bytes)
    : path_(std::move(path)), fd_(fd), size_bytes_(size_bytes) {}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_bytes_(other.size_bytes_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_bytes_ = other.size_bytes_;
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::read_exact(std::uint64_t offset, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got =
        ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      throw FileError(got < 0 ? errno : EIO,
                      "read " + std::to_string(out.size()) + " bytes at offset " +
                          std::to_string(offset) + (got == 0 ? " (end of file) of" : " of"),
                      path_);
    }
    done += static_cast<std::size_t>(got);
  }
}

OutputFile OutputFile::create(const std::filesystem::path& path) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw FileError(errno, "create", temporary);
  return OutputFile(path, std::move(temporary), fd);
}

OutputFile::OutputFile(std::filesystem::path path, std::filesystem::path temporary, int fd)
    : path_(std::move(path)), temporary_(std::move(temporary)), fd_(fd) {}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)),
      temporary_(std::move(other.temporary_)),
      fd_(std::exchange(other.fd_, -1)),
      written_bytes_(other.written_bytes_) {}

OutputFile::~OutputFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void OutputFile::write(std::span<const std::byte> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t wrote = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) {
      throw FileError(errno,
                      "write " + std::to_string(bytes.size() - done) + " bytes at offset " +
                          std::to_string(written_bytes_ + done) + " of",
                      temporary_);
    }
    done += static_cast<std::size_t>(wrote);
  }
  written_bytes_ += bytes.size();
}

void OutputFile::commit() {
  if (::fsync(fd_) != 0) throw FileError(errno, "fsync", temporary_);
  ::close(std::exchange(fd_, -1));
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error_number = errno;
    ::unlink(temporary_.c_str());
    throw FileError(error_number, "rename '" + temporary_.string() + "' to", path_);
  }
  runtime::sync_directory(path_.has_parent_path() ? path_.parent_path() : ".");
}

std::string read_text_file(const std::filesystem::path& path) {
  const ReadOnlyFile file = ReadOnlyFile::open(path);
  std::string text(file.size_bytes(), '\0');
  file.read_exact(0, std::as_writable_bytes(std::span<char>(text)));
  return text;
}

}  // namespace strata::llm
