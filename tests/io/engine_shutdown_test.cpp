// Proves an engine destroyed with requests queued and in the kernel neither hangs nor leaks: every
// ticket completes (done or ECANCELED) and stays readable after the engine is gone; pieces stuck
// in the kernel are cancelled.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <cerrno>

#include <chrono>
#include <vector>

#include "io_test_support.hpp"

namespace strata::io {
namespace {

using testing::AllConfigs;
using testing::ConfigNames;
using testing::ScratchDir;

template <class C>
class EngineShutdownTest : public ::testing::Test {};
TYPED_TEST_SUITE(EngineShutdownTest, AllConfigs, ConfigNames);

TYPED_TEST(EngineShutdownTest, DestroyWithRequestsInFlightCompletesEveryTicket) {
  ScratchDir dir;
  IoEngineOptions options;
  options.block_size_bytes = 16 * kKiB;
  options.queue_depth = 4;
  options.rings = 2;
  std::string skip;
  std::unique_ptr<IoEngine> engine = testing::make_test_engine<TypeParam>(options, dir, skip);
  if (!engine) {
    GTEST_SKIP() << skip;
  }
  const FileId file = engine->open_file(dir / "shutdown.bin", 4 * kMiB);
  AlignedBuffer buffer = AlignedBuffer::allocate(4 * kMiB);
  std::vector<Ticket> tickets;
  for (std::uint64_t i = 0; i < 64; ++i) {
    tickets.push_back(engine->submit(
        IoRequest::write(file, i * 64 * kKiB, buffer.span().subspan(i * 64 * kKiB, 64 * kKiB))));
  }
  const auto started = std::chrono::steady_clock::now();
  engine.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  int cancelled = 0;
  for (const Ticket& ticket : tickets) {
    ASSERT_TRUE(ticket.poll()) << "a ticket outlived its engine unfinished";
    if (!ticket.ok()) {
      try {
        ticket.get();
      } catch (const IoError& error) {
        EXPECT_EQ(error.code().value(), ECANCELED) << error.what();
        ++cancelled;
      }
    }
  }
  // Not asserted > 0: a fast disk may finish everything first. Either way nothing hung or leaked.
  ::testing::Test::RecordProperty("cancelled", cancelled);
}

TYPED_TEST(EngineShutdownTest, IdleEngineStopsAtOnce) {
  ScratchDir dir;
  std::string skip;
  std::unique_ptr<IoEngine> engine = testing::make_test_engine<TypeParam>({}, dir, skip);
  if (!engine) {
    GTEST_SKIP() << skip;
  }
  const auto started = std::chrono::steady_clock::now();
  engine.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
}

}  // namespace
}  // namespace strata::io

namespace strata::io {
namespace {

// A read of an empty FIFO never completes on its own: the one way to have pieces surely stuck in
// the kernel at shutdown. io_uring only (pread on a FIFO is ESPIPE).
TEST(UringShutdownTest, PiecesStuckInTheKernelAreCancelled) {
  testing::ScratchDir dir;
  const std::filesystem::path fifo = dir / "stuck.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  IoEngineOptions options;
  options.direct = DirectIo::kOff;
  options.queue_depth = 4;
  options.rings = 1;
  std::unique_ptr<IoEngine> engine;
  try {
    engine = std::make_unique<UringEngine>(options);
  } catch (const UringUnavailable& refused) {
    GTEST_SKIP() << "io_uring refused by this kernel: " << refused.what();
  }
  // O_RDWR on a FIFO does not block at open (Linux).
  const FileId file =
      engine->add_file(FileHandle::open(fifo, {CreateMode::kOpenExisting, DirectIo::kOff}));
  AlignedBuffer buffer = AlignedBuffer::allocate(10 * 4096);
  std::vector<Ticket> tickets;
  for (std::size_t i = 0; i < 10; ++i) {  // 4 in the kernel, 6 queued
    tickets.push_back(
        engine->submit(IoRequest::read(file, 0, buffer.span().subspan(i * 4096, 4096))));
  }
  EXPECT_FALSE(tickets[0].wait_for(std::chrono::milliseconds(50))) << "the FIFO had data?";
  const auto started = std::chrono::steady_clock::now();
  engine.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  for (const Ticket& ticket : tickets) {
    ASSERT_TRUE(ticket.poll());
    ASSERT_FALSE(ticket.ok());
    try {
      ticket.get();
    } catch (const IoError& error) {
      EXPECT_EQ(error.code().value(), ECANCELED) << error.what();
    }
  }
}

}  // namespace
}  // namespace strata::io
