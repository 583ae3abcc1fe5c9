#include "examples/gpt/file_bytes.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace strata::gpt {
namespace {

// Closes the descriptor quietly on every exit path; close errors after a checked fsync carry no
// news about the data.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

FileError::FileError(int error_number, const std::string& operation, std::filesystem::path path)
    : std::system_error(error_number, std::generic_category(),
                        operation + " '" + path.string() + "'"),
      path_(std::move(path)) {}

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path) {
  const FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw FileError(errno, "open for reading", path);
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    throw FileError(errno, "stat", path);
  }
  if (!S_ISREG(info.st_mode)) {
    throw FileError(S_ISDIR(info.st_mode) ? EISDIR : EINVAL, "read (not a regular file)", path);
  }
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(info.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw FileError(errno, "read at offset " + std::to_string(done) + " of", path);
    }
    if (got == 0) {  // the file shrank under us
      bytes.resize(done);
      break;
    }
    done += static_cast<std::size_t>(got);
  }
  return bytes;
}

void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> chunks) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  {
    const FileDescriptor fd(
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      throw FileError(errno, "create", temporary);
    }
    std::size_t offset = 0;
    for (const std::span<const std::uint8_t> chunk : chunks) {
      std::size_t done = 0;
      while (done < chunk.size()) {
        const ssize_t wrote = ::write(fd.get(), chunk.data() + done, chunk.size() - done);
        if (wrote < 0) {
          if (errno == EINTR) {
            continue;
          }
          const int error_number = errno;
          ::unlink(temporary.c_str());
          throw FileError(error_number,
                          "write " + std::to_string(chunk.size() - done) + " bytes at offset " +
                              std::to_string(offset + done) + " of",
                          temporary);
        }
        done += static_cast<std::size_t>(wrote);
      }
      offset += chunk.size();
    }
    if (::fsync(fd.get()) != 0) {
      const int error_number = errno;
      ::unlink(temporary.c_str());
      throw FileError(error_number, "fsync", temporary);
    }
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error_number = errno;
    ::unlink(temporary.c_str());
    throw FileError(error_number, "rename '" + temporary.string() + "' to", path);
  }
}

}  // namespace strata::gpt
