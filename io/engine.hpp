// IoEngine: asynchronous reads, writes and fsyncs of registered files. The io_uring and POSIX
// engines implement it; callers (the NVMe store, benchmarks, tests) only see this interface.
//
// Threading: submit(), add_file() and open_file() may be called from any thread at any time; the
// engine's own I/O threads run the pieces and complete the tickets. Destroying the engine waits for
// the pieces already in the kernel and completes queued ones with ECANCELED; no thread may submit
// while it is being destroyed. Tickets stay valid after the engine is gone.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "io/engine_options.hpp"
#include "io/file_handle.hpp"
#include "io/io_request.hpp"
#include "io/ticket.hpp"

namespace strata::io {

namespace detail {
struct Piece;
}

class IoEngine {
 public:
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;
  virtual ~IoEngine();

  // Takes ownership of an open file; the id names it in requests for the engine's lifetime.
  FileId add_file(FileHandle file);
  // Opens (creating) `path` the way options().direct says, preallocates it to size_bytes, adds it.
  FileId open_file(const std::filesystem::path& path, std::uint64_t size_bytes,
                   CreateMode create = CreateMode::kCreate);
  const FileHandle& file(FileId id) const;

  // Splits the request into block_size pieces and queues them; blocks only while the queues are
  // full. The returned ticket completes when every piece has.
  Ticket submit(const IoRequest& request);
  // One ticket for the whole batch (e.g. the stripes of one logical request).
  Ticket submit(std::span<const IoRequest> requests);
  // Durability: fsync of the file, ordered after nothing (wait for the writes' tickets first).
  Ticket sync(FileId file) { return submit(IoRequest::fsync(file)); }

  virtual std::string_view name() const = 0;
  const IoEngineOptions& options() const noexcept { return options_; }

 protected:
  explicit IoEngine(const IoEngineOptions& options);
  // Hands one piece to the backend's queues; may block while they are full.
  virtual void enqueue(detail::Piece& piece) = 0;

 private:
  IoEngineOptions options_;
  mutable std::mutex files_mutex_;
  std::vector<std::unique_ptr<FileHandle>> files_;  // pointers stay stable for the I/O threads
};

}  // namespace strata::io
