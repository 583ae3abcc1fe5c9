// Proves IoEngineOptions::queued_pieces is the hand-off queue's capacity: with queue_depth pieces
// stuck in the kernel, exactly queued_pieces more submissions return and the next one waits (the
// blocking the Engine avoids by sizing the queue to its staging), for the default and a larger one.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "io/uring_engine.hpp"
#include "io/uring_unavailable.hpp"
#include "io_test_support.hpp"

namespace strata::io {
namespace {

// Submits `count` 4 KiB reads of an empty FIFO (they stay in the kernel until data arrives) from
// another thread and returns how many submit() calls returned before it blocked; then feeds the
// FIFO so every read completes, and joins.
std::size_t submissions_before_blocking(std::uint32_t queued_pieces, std::size_t count) {
  testing::ScratchDir dir;
  const std::filesystem::path fifo = dir / "stuck.fifo";
  EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  IoEngineOptions options;
  options.direct = DirectIo::kOff;
  options.queue_depth = 2;
  options.queued_pieces = queued_pieces;
  UringEngine engine(options);
  // O_RDWR on a FIFO does not block at open (Linux).
  const FileId file =
      engine.add_file(FileHandle::open(fifo, {CreateMode::kOpenExisting, DirectIo::kOff}));
  AlignedBuffer buffer = AlignedBuffer::allocate(count * 4096);
  std::atomic<std::size_t> submitted{0};
  std::vector<Ticket> tickets(count);
  std::thread submitter([&] {
    for (std::size_t i = 0; i < count; ++i) {
      tickets[i] = engine.submit(IoRequest::read(file, 0, buffer.span().subspan(i * 4096, 4096)));
      submitted.fetch_add(1);
    }
  });
  // Wait for the count to stop growing: a blocked submit() never returns by itself.
  std::size_t seen = 0;
  for (int quiet_polls = 0; quiet_polls < 20;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::size_t now = submitted.load();
    quiet_polls = now == seen && now > 0 ? quiet_polls + 1 : 0;
    seen = now;
  }
  const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
  EXPECT_GE(writer, 0);
  std::vector<std::byte> data(4096);
  // The pipe holds 64 KiB: when it is full (EAGAIN), wait for the reads to drain it.
  for (std::size_t i = 0; i < count;) {
    const ssize_t written = ::write(writer, data.data(), data.size());
    if (written == 4096) {
      ++i;
    } else {
      EXPECT_TRUE(written < 0 && errno == EAGAIN) << "wrote " << written;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  submitter.join();
  for (const Ticket& ticket : tickets) ticket.get();
  ::close(writer);
  return seen;
}

TEST(QueuedPieces, TheDefaultQueueHoldsTwiceTheDepth) {
  try {
    UringEngine probe(IoEngineOptions{});
  } catch (const UringUnavailable& refused) {
    GTEST_SKIP() << "io_uring refused by this kernel: " << refused.what();
  }
  // 2 in the kernel + 4 queued return; the 7th waits.
  EXPECT_EQ(submissions_before_blocking(/*queued_pieces=*/0, 8), 6u);
}

TEST(QueuedPieces, ALargerQueueTakesEverySubmissionWithoutBlocking) {
  try {
    UringEngine probe(IoEngineOptions{});
  } catch (const UringUnavailable& refused) {
    GTEST_SKIP() << "io_uring refused by this kernel: " << refused.what();
  }
  EXPECT_EQ(submissions_before_blocking(/*queued_pieces=*/30, 32), 32u);
  EXPECT_EQ(pieces_for(10 * kMiB, 3, kMiB), 16u);  // 10 full blocks + 2 ragged ends per request
}

}  // namespace
}  // namespace strata::io
