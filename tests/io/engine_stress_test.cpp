// Proves the engines stay exact under load: thousands of concurrent requests from several threads
// over several rings and files, every byte checked.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "io_test_support.hpp"

namespace strata::io {
namespace {

using testing::ConfigNames;
using testing::ScratchDir;

template <class C>
class EngineStressTest : public ::testing::Test {};
using StressConfigs =
    ::testing::Types<testing::UringDirect, testing::UringBuffered, testing::PosixDirect>;
TYPED_TEST_SUITE(EngineStressTest, StressConfigs, ConfigNames);

constexpr int kThreads = 4;
constexpr int kFiles = 4;
constexpr std::uint64_t kRequestsPerThread = 512;
constexpr std::uint64_t kSlot = 16 * kKiB;  // requests are 4..16 KiB inside their own slot
constexpr std::uint64_t kSlots = kThreads * kRequestsPerThread;

// The stress test's slots: slot s lives in file s % kFiles at (s / kFiles) * kSlot and holds
// lengths[s] bytes, written from `expected`, read back into `actual`.
struct Slots {
  std::vector<FileId> files;
  AlignedBuffer expected, actual;
  std::vector<std::uint64_t> lengths;

  IoRequest request(IoOp op, std::uint64_t slot) const {
    std::byte* base = (op == IoOp::kWrite ? expected : actual).data() + slot * kSlot;
    return IoRequest{op, files[slot % kFiles], slot / kFiles * kSlot, {base, lengths[slot]}, {}};
  }
};

// `op` on every slot: kThreads threads each submit kRequestsPerThread requests, then wait for
// them, counting those that fail or transfer less than asked.
void submit_every_slot(IoEngine& engine, const Slots& slots, IoOp op) {
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Ticket> tickets;
      tickets.reserve(kRequestsPerThread);
      for (std::uint64_t i = 0; i < kRequestsPerThread; ++i) {
        tickets.push_back(engine.submit(slots.request(op, t * kRequestsPerThread + i)));
      }
      for (std::uint64_t i = 0; i < kRequestsPerThread; ++i) {
        const std::uint64_t slot = t * kRequestsPerThread + i;
        if (!tickets[i].ok() || tickets[i].bytes_transferred() != slots.lengths[slot]) {
          ++failures[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[static_cast<std::size_t>(t)], 0) << to_string(op) << " thread " << t;
  }
}

TYPED_TEST(EngineStressTest, ThousandsOfConcurrentRequestsOverRingsAndFiles) {
  const std::uint64_t seed = 0x5eed0004;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ScratchDir dir;
  IoEngineOptions options;
  options.block_size_bytes = 8 * kKiB;  // small blocks: one or two pieces per request
  options.queue_depth = 16;
  options.rings = 4;
  std::string skip;
  std::unique_ptr<IoEngine> engine = testing::make_test_engine<TypeParam>(options, dir, skip);
  if (!engine) {
    GTEST_SKIP() << skip;
  }
  Slots slots;
  for (int f = 0; f < kFiles; ++f) {
    slots.files.push_back(
        engine->open_file(dir / ("stress" + std::to_string(f)), kSlots / kFiles * kSlot));
  }
  slots.expected = AlignedBuffer::allocate(kSlots * kSlot);
  slots.actual = AlignedBuffer::allocate(kSlots * kSlot);
  // Lay the files out first, as fio does: on ext4, O_DIRECT writes that leave unwritten gaps in
  // fallocated extents split them one journal transaction at a time (seconds, not the engine).
  for (FileId file : slots.files) {
    engine->submit(IoRequest::write(file, 0, slots.actual.span().first(kSlots / kFiles * kSlot)))
        .get();
  }
  testing::fill_random(slots.expected.span(), seed);
  slots.lengths.resize(kSlots);
  std::mt19937_64 random(seed);
  for (std::uint64_t& length : slots.lengths) {
    length = (1 + random() % 4) * 4 * kKiB;
  }
  for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
    submit_every_slot(*engine, slots, op);
  }
  for (std::uint64_t slot = 0; slot < kSlots; ++slot) {
    ASSERT_EQ(std::memcmp(slots.actual.data() + slot * kSlot, slots.expected.data() + slot * kSlot,
                          slots.lengths[slot]),
              0)
        << "slot " << slot;
  }
}

}  // namespace
}  // namespace strata::io
