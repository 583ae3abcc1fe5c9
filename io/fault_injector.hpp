// FaultInjector: makes chosen I/O operations fail, transfer short, or return flipped bytes, so
// tests can drive every error path of the engines. Compiled in, off unless an engine is given one
// (IoEngineOptions::faults); production code never sets it.
//
// Both engines consult it at the point a piece's system call has returned, before they look at the
// result, so an injected fault travels exactly the path a real one would: EAGAIN/EINTR are retried,
// a short transfer is resubmitted for the remainder, any other errno fails the piece's ticket.
// A flipped byte is silent, like real media corruption: detecting it is the job of the checksums
// above io/ (the NVMe store's manifest); tests use it to prove those checksums catch it.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/io_request.hpp"

namespace strata::io {

enum class FaultKind : std::uint8_t {
  kFailErrno,       // the operation returns -error_number
  kShortTransfer,   // the operation reports about half of what it moved (alignment kept)
  kFlipByteOnRead,  // a read succeeds but one byte of the buffer is inverted
};

struct FaultRule {
  // Which operations match: all conditions that are set must hold.
  std::optional<std::uint64_t> nth_operation;  // 1-based count over every completed operation
  std::string path_contains;                   // empty: any path
  std::optional<IoOp> op;                      // nullopt: any op
  FaultKind kind = FaultKind::kFailErrno;
  int error_number = EIO;
  // How many times the rule may fire.
  std::uint64_t times = std::numeric_limits<std::uint64_t>::max();

  static FaultRule fail_nth(std::uint64_t n, int error_number) {
    return {n, {}, std::nullopt, FaultKind::kFailErrno, error_number, 1};
  }
  static FaultRule fail_path(std::string path_contains, int error_number,
                             std::optional<IoOp> op = std::nullopt) {
    return {std::nullopt, std::move(path_contains),
            op,           FaultKind::kFailErrno,
            error_number, std::numeric_limits<std::uint64_t>::max()};
  }
  static FaultRule short_nth(std::uint64_t n) {
    return {n, {}, std::nullopt, FaultKind::kShortTransfer, 0, 1};
  }
  static FaultRule flip_nth_read(std::uint64_t n) {
    return {n, {}, IoOp::kRead, FaultKind::kFlipByteOnRead, 0, 1};
  }
};

// One fault that fired, for tests to check which request it hit.
struct FaultEvent {
  FaultKind kind;
  IoOp op;
  std::string path;
  std::uint64_t offset_bytes;
  std::uint64_t operation_number;
};

class FaultInjector {
 public:
  void add(FaultRule rule);
  void clear();
  // Makes the next io_uring ring setup fail with error_number (ENOSYS, EPERM...), as a kernel that
  // refuses io_uring would; lets tests cover the `auto` fallback to POSIX.
  void fail_ring_setup(int error_number);
  std::optional<int> take_ring_setup_error();

  // Called by an engine when one operation (one system call of one piece) has returned `result`
  // (bytes moved, or -errno). `buffer` is where the bytes went or came from; `alignment` is what a
  // shortened transfer must stay a multiple of (4096 for O_DIRECT, 1 otherwise).
  // Returns the result the engine must act on. Thread-safe.
  std::int64_t on_complete(IoOp op, std::string_view path, std::uint64_t offset_bytes,
                           std::span<std::byte> buffer, std::size_t alignment, std::int64_t result);

  std::uint64_t operations() const;
  std::vector<FaultEvent> events() const;

 private:
  mutable std::mutex mutex_;
  std::vector<FaultRule> rules_;
  std::vector<FaultEvent> events_;
  std::uint64_t operations_ = 0;
  std::optional<int> ring_setup_error_;
};

}  // namespace strata::io
