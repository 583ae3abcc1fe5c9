// ChecksumWorker: the NVMe store's XXH3 work, off the thread that reads and writes (the optimizer's
// Adam thread). One thread takes jobs in submission order. A write's job hashes the bytes while
// the disk takes them; a read's job verifies the bytes once they have landed. Either completes
// the ticket the store hands out only when both the I/O and the hash are done, so a caller that
// waits on a write's ticket may reuse the buffer (the hash no longer reads it), and one that waits
// on a read's ticket holds verified bytes.
//
// Threading: hash_write / verify_read from the store's owner thread; the returned tickets may be
// waited on from any thread. The destructor runs every queued job, then joins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "io/detail/bounded_queue.hpp"
#include "io/ticket.hpp"

namespace strata::tiers {

class ChecksumWorker {
 public:
  // capacity: jobs queued at most; a submitting thread waits beyond it (the store sizes it to
  // twice its extents: one write and one read of each in flight).
  explicit ChecksumWorker(std::size_t capacity);
  ChecksumWorker(const ChecksumWorker&) = delete;
  ChecksumWorker& operator=(const ChecksumWorker&) = delete;
  ~ChecksumWorker();

  // Completes once `write` has and *checksum holds the XXH3 of `data` (both stay alive till then).
  io::Ticket hash_write(io::Ticket write, std::span<const std::byte> data,
                        std::shared_ptr<std::uint64_t> checksum);
  // Completes once `read` has and `data` matched *expected (read by the worker, in order: a write
  // hashed earlier has set it); a mismatch fails the ticket with StoreCorruption naming `where`.
  io::Ticket verify_read(io::Ticket read, std::span<const std::byte> data,
                         std::shared_ptr<const std::uint64_t> expected, std::string where);

 private:
  struct Job {
    io::Ticket io;
    std::span<const std::byte> data;
    std::shared_ptr<std::uint64_t> hash_into;       // a write's
    std::shared_ptr<const std::uint64_t> expected;  // a read's
    std::string where;
    std::shared_ptr<io::detail::TicketState> done;
  };
  io::Ticket enqueue(Job job);
  static void run(Job& job);

  io::detail::BoundedQueue<Job> queue_;
  std::thread thread_;  // last: starts once the queue exists
};

}  // namespace strata::tiers
