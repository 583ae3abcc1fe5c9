#include "io/file_handle.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "io/detail/power_loss_hook.hpp"
#include "io/io_error.hpp"

namespace strata::io {

FileHandle FileHandle::open(const std::filesystem::path& path, const OpenOptions& options) {
  const bool read_only = options.access == Access::kReadOnly;
  int flags = (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  if (!read_only && options.create != CreateMode::kOpenExisting) {
    flags |= O_CREAT;
  }
  if (!read_only && options.create == CreateMode::kCreateTruncate) {
    flags |= O_TRUNC;
  }
  if (options.direct == DirectIo::kOn) {
    flags |= O_DIRECT;
  }
  // Only a power-loss simulation needs to know whether the open creates the file.
  const bool may_create = (flags & O_CREAT) != 0 && detail::active_power_loss() != nullptr;
  std::error_code ignored;  // an unreadable parent: open() below reports it
  const bool existed = may_create && std::filesystem::exists(path, ignored);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd >= 0 && may_create) {
    if (!existed) {
      detail::report_create_file(path);
    } else if ((flags & O_TRUNC) != 0) {
      detail::report_truncate(path);
    }
  }
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

FileHandle FileHandle::open_directory(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw IoError("open directory", path.string(), 0, 0, errno);
  }
  return FileHandle(fd, path.string(), DirectIo::kOff);
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
    detail::report_allocate(path_, size_bytes);
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
  detail::report_allocate(path_, size_bytes);
}

void FileHandle::sync() const {
  if (::fsync(fd_) != 0) {
    throw IoError("fsync", path_, 0, 0, errno);
  }
  detail::report_fsync(path_);
}

std::uint64_t FileHandle::size_bytes() const {
  struct stat status {};
  if (::fstat(fd_, &status) != 0) {
    throw IoError("fstat", path_, 0, 0, errno);
  }
  return static_cast<std::uint64_t>(status.st_size);
}

bool FileHandle::is_regular_file() const {
  struct stat status {};
  if (::fstat(fd_, &status) != 0) {
    throw IoError("fstat", path_, 0, 0, errno);
  }
  return S_ISREG(status.st_mode);
}

std::size_t FileHandle::read_at(std::uint64_t offset_bytes, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = ::pread(fd_, out.data() + done, out.size() - done,
                                static_cast<off_t>(offset_bytes + done));
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw IoError("read", path_, offset_bytes + done, out.size() - done, errno);
    }
    if (got == 0) {
      break;  // end of file
    }
    done += static_cast<std::size_t>(got);
  }
  return done;
}

void FileHandle::write_at(std::uint64_t offset_bytes, std::span<const std::byte> bytes) const {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t wrote = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                                   static_cast<off_t>(offset_bytes + done));
    if (wrote < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw IoError("write", path_, offset_bytes + done, bytes.size() - done, errno);
    }
    done += static_cast<std::size_t>(wrote);
  }
  if (!bytes.empty()) detail::report_write(path_, offset_bytes, bytes);
}

bool FileHandle::try_lock_exclusive() const {
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) {
      continue;
    }
    if (errno == EWOULDBLOCK) {
      return false;
    }
    throw IoError("flock", path_, 0, 0, errno);
  }
  return true;
}

}  // namespace strata::io
