#include "tiers/checksum_worker.hpp"

#include <exception>

#include <fmt/format.h>

#include "tiers/checksum.hpp"
#include "tiers/nvme_store.hpp"

namespace strata::tiers {

ChecksumWorker::ChecksumWorker(std::size_t capacity)
    : queue_(capacity), thread_([this] {
        while (std::optional<Job> job = queue_.pop()) run(*job);
      }) {}

ChecksumWorker::~ChecksumWorker() {
  queue_.close();
  thread_.join();
  // Jobs still queued hold tickets callers may wait on, and buffers the I/O still uses.
  for (Job& job : queue_.drain()) run(job);
}

io::Ticket ChecksumWorker::hash_write(io::Ticket write, std::span<const std::byte> data,
                                      std::shared_ptr<std::uint64_t> checksum) {
  Job job;
  job.io = std::move(write);
  job.data = data;
  job.hash_into = std::move(checksum);
  return enqueue(std::move(job));
}

io::Ticket ChecksumWorker::verify_read(io::Ticket read, std::span<const std::byte> data,
                                       std::shared_ptr<const std::uint64_t> expected,
                                       std::string where) {
  Job job;
  job.io = std::move(read);
  job.data = data;
  job.expected = std::move(expected);
  job.where = std::move(where);
  return enqueue(std::move(job));
}

io::Ticket ChecksumWorker::enqueue(Job job) {
  job.done = std::make_shared<io::detail::TicketState>(1);
  io::Ticket ticket(job.done);
  if (!queue_.push(job)) run(job);  // closed: only while destroying, and then nobody submits
  return ticket;
}

void ChecksumWorker::run(Job& job) {
  std::exception_ptr error;
  if (job.hash_into) {
    // The disk reads the buffer while we do; neither writes it.
    *job.hash_into = xxh3(job.data);
    job.io.wait();
    error = job.io.error();
  } else {
    job.io.wait();
    error = job.io.error();
    if (!error && xxh3(job.data) != *job.expected) {
      error = std::make_exception_ptr(StoreCorruption(
          fmt::format("checksum mismatch reading {}: the bytes on disk are not the ones "
                      "committed; refusing to use them",
                      job.where)));
    }
  }
  job.done->complete_piece(error ? 0 : job.io.bytes_transferred(), error);
}

}  // namespace strata::tiers
