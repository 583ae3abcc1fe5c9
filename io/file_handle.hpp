// FileHandle: one open file descriptor, owned and move-only, that remembers its path for errors.
// Every file strata opens outside the I/O engines goes through it (io/whole_file.hpp builds the
// whole-file reads and atomic writes on it); every failed system call throws IoError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace strata::io {

enum class CreateMode : std::uint8_t { kOpenExisting, kCreate, kCreateTruncate };
enum class DirectIo : std::uint8_t { kOff, kOn };
enum class Access : std::uint8_t { kReadWrite, kReadOnly };

struct OpenOptions {
  CreateMode create = CreateMode::kCreate;
  // kOn opens with O_DIRECT: offsets, lengths and buffer addresses must then be 4 KiB aligned.
  DirectIo direct = DirectIo::kOn;
  // kReadOnly opens O_RDONLY and never creates (`create` is then ignored).
  Access access = Access::kReadWrite;
};

class FileHandle {
 public:
  FileHandle() = default;
  // Opens read-write (read-only with Access::kReadOnly). Throws IoError naming the path; when the
  // file system refuses O_DIRECT (EINVAL, e.g. tmpfs) the message says that `direct = false` will
  // work.
  static FileHandle open(const std::filesystem::path& path, const OpenOptions& options = {});
  // Opens a directory (O_RDONLY | O_DIRECTORY), to sync() it after creating or renaming entries.
  static FileHandle open_directory(const std::filesystem::path& path);

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
  // True for a regular file (not a directory, device or pipe). Throws IoError.
  bool is_regular_file() const;

  // Reads up to out.size() bytes at `offset_bytes`, resuming after EINTR and short reads; returns
  // how many it read, fewer than asked only where the file ends. Throws IoError naming the offset.
  std::size_t read_at(std::uint64_t offset_bytes, std::span<std::byte> out) const;
  // Writes all of `bytes` at `offset_bytes`, resuming after EINTR and short writes. Throws IoError
  // naming the offset and length still unwritten.
  void write_at(std::uint64_t offset_bytes, std::span<const std::byte> bytes) const;
  // An exclusive advisory lock (flock) held until the handle closes. False when another open file
  // description holds it; other failures throw IoError.
  bool try_lock_exclusive() const;

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
