// IoError: the one exception type io/ raises for a failed system call, naming what failed and
// where.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace strata::io {

// A failed operation on a file: `operation` is "read", "write", "fsync", "open", "fallocate", ...
// code() is the errno as std::generic_category(); what() reads
//   "read of '/nvme0/swap.bin' at offset 4096, length 1048576 failed: Input/output error"
// followed by `hint` when one was given (e.g. how to avoid O_DIRECT).
class IoError : public std::system_error {
 public:
  IoError(std::string_view operation, std::string_view path, std::uint64_t offset_bytes,
          std::uint64_t length_bytes, int error_number, std::string_view hint = {});

  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& operation() const noexcept { return operation_; }
  const std::string& path() const noexcept { return path_; }
  std::uint64_t offset_bytes() const noexcept { return offset_bytes_; }
  std::uint64_t length_bytes() const noexcept { return length_bytes_; }
  int error_number() const noexcept { return code().value(); }

 private:
  std::string operation_;
  std::string path_;
  std::uint64_t offset_bytes_;
  std::uint64_t length_bytes_;
  std::string message_;
};

}  // namespace strata::io
