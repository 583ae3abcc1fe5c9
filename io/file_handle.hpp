// FileHandle: one open file descriptor, owned and move-only, that remembers its path for errors.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace strata::io {

enum class CreateMode : std::uint8_t { kOpenExisting, kCreate, kCreateTruncate };
enum class DirectIo : std::uint8_t { kOff, kOn };

struct OpenOptions {
  CreateMode create = CreateMode::kCreate;
  // kOn opens with O_DIRECT: offsets, lengths and buffer addresses must then be 4 KiB aligned.
  DirectIo direct = DirectIo::kOn;
};

class FileHandle {
 public:
  FileHandle() = default;
  // Opens read-write. Throws IoError naming the path; when the file system refuses O_DIRECT
  // (EINVAL, e.g. tmpfs) the message says that `direct = false` will work.
  static FileHandle open(const std::filesystem::path& path, const OpenOptions& options = {});

  FileHandle(FileHandle&& other) noexcept;
  FileHandle& operator=(FileHandle&& other) noexcept;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  ~FileHandle();  // closes quietly

  // Reserves blocks for [0, size_bytes) so later writes neither allocate nor fail for space
  // (fallocate; ftruncate where the file system has no fallocate). Never shrinks the file.
  void allocate(std::uint64_t size_bytes) const;
  // fsync: data and metadata durable. Throws IoError.
  void sync() const;
  std::uint64_t size_bytes() const;

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  bool direct() const noexcept { return direct_ == DirectIo::kOn; }
  bool valid() const noexcept { return fd_ >= 0; }

 private:
  FileHandle(int fd, std::string path, DirectIo direct)
      : fd_(fd), path_(std::move(path)), direct_(direct) {}

  int fd_ = -1;
  std::string path_;
  DirectIo direct_ = DirectIo::kOff;
};

}  // namespace strata::io
