#include "io/file_handle.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "io/io_error.hpp"

namespace strata::io {

FileHandle FileHandle::open(const std::filesystem::path& path, const OpenOptions& options) {
  int flags = O_RDWR | O_CLOEXEC;
  if (options.create != CreateMode::kOpenExisting) {
    flags |= O_CREAT;
  }
  if (options.create == CreateMode::kCreateTruncate) {
    flags |= O_TRUNC;
  }
  if (options.direct == DirectIo::kOn) {
    flags |= O_DIRECT;
  }
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    const int error_number = errno;
    if (error_number == EINVAL && options.direct == DirectIo::kOn) {
      throw IoError("open with O_DIRECT", path.string(), 0, 0, error_number,
                    "this file system refuses O_DIRECT; `direct = false` will work, with "
                    "buffered I/O through the page cache");
    }
    throw IoError("open", path.string(), 0, 0, error_number);
  }
  return FileHandle(fd, path.string(), options.direct);
}

FileHandle::FileHandle(FileHandle&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), direct_(other.direct_) {}

FileHandle& FileHandle::operator=(FileHandle&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    direct_ = other.direct_;
  }
  return *this;
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

void FileHandle::allocate(std::uint64_t size_bytes) const {
  if (size_bytes == 0) {
    return;
  }
  const auto length = static_cast<off_t>(size_bytes);
  if (::fallocate(fd_, 0, 0, length) == 0) {
    return;
  }
  const int error_number = errno;
  if (error_number != EOPNOTSUPP) {
    throw IoError("fallocate", path_, 0, size_bytes, error_number);
  }
  // No fallocate here (some network and FUSE file systems): a sparse file of the right size.
  if (this->size_bytes() < size_bytes && ::ftruncate(fd_, length) != 0) {
    throw IoError("ftruncate", path_, 0, size_bytes, errno);
  }
}

void FileHandle::sync() const {
  if (::fsync(fd_) != 0) {
    throw IoError("fsync", path_, 0, 0, errno);
  }
}

std::uint64_t FileHandle::size_bytes() const {
  struct stat status {};
  if (::fstat(fd_, &status) != 0) {
    throw IoError("fstat", path_, 0, 0, errno);
  }
  return static_cast<std::uint64_t>(status.st_size);
}

}  // namespace strata::io
