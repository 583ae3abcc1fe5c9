// Proves every injected fault (errno, short transfer, EAGAIN/EINTR, flipped byte) takes the path a
// real one would on every engine: errors land on the right ticket with a full message, retries and
// short transfers recover exact bytes, no ticket reports success with wrong bytes, and the engine
// stays usable after a failure.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/fault_injector.hpp"
#include "io_test_support.hpp"

namespace strata::io {
namespace {

using testing::AllConfigs;
using testing::ConfigNames;
using testing::ScratchDir;

constexpr std::uint64_t kBlock = 64 * kKiB;

template <class C>
class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IoEngineOptions options;
    options.block_size_bytes = kBlock;
    options.queue_depth = 4;
    options.rings = 2;
    options.faults = &faults_;
    std::string skip;
    engine_ = testing::make_test_engine<C>(options, dir_, skip);
    if (!engine_) {
      GTEST_SKIP() << skip;
    }
    file_ = engine_->open_file(dir_ / "faulty.bin", kMiB);
    out_ = AlignedBuffer::allocate(kMiB);
    in_ = AlignedBuffer::allocate(kMiB);
    testing::fill_random(out_.span(), 42);
    engine_->submit(IoRequest::write(file_, 0, out_.span())).get();
    faults_.clear();
    operations_before_ = faults_.operations();
  }
  // Reads [offset, offset + length) and says whether it matches what SetUp wrote.
  bool reads_back(std::uint64_t offset, std::uint64_t length) {
    std::memset(in_.data(), 0, length);
    engine_->submit(IoRequest::read(file_, offset, in_.span().first(length))).get();
    return std::memcmp(in_.data(), out_.data() + offset, length) == 0;
  }

  FaultInjector faults_;  // declared first: the engine must not outlive it
  ScratchDir dir_;
  std::unique_ptr<IoEngine> engine_;
  FileId file_ = 0;
  AlignedBuffer out_;
  AlignedBuffer in_;
  std::uint64_t operations_before_ = 0;
};
TYPED_TEST_SUITE(FaultInjectionTest, AllConfigs, ConfigNames);

TYPED_TEST(FaultInjectionTest, NthOperationFailsOnlyItsTicketAndNamesEverything) {
  this->faults_.add(FaultRule::fail_nth(this->faults_.operations() + 3, EIO));
  std::vector<Ticket> tickets;
  // One piece per request, each waited for, so operation numbers are deterministic.
  for (std::uint64_t i = 0; i < 6; ++i) {
    tickets.push_back(this->engine_->submit(
        IoRequest::read(this->file_, i * kBlock, this->in_.span().subspan(i * kBlock, kBlock))));
    tickets.back().wait();
  }
  for (std::size_t i = 0; i < tickets.size(); ++i) {
    EXPECT_EQ(tickets[i].ok(), i != 2) << "ticket " << i;
  }
  try {
    tickets[2].get();
    FAIL() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), EIO);
    EXPECT_EQ(error.operation(), "read");
    EXPECT_EQ(error.offset_bytes(), 2 * kBlock);
    EXPECT_EQ(error.length_bytes(), kBlock);
    const std::string what = error.what();
    EXPECT_NE(what.find("faulty.bin"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(2 * kBlock)), std::string::npos) << what;
    EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
  }
  EXPECT_TRUE(this->reads_back(0, kMiB)) << "engine unusable after a failed request";
}

TYPED_TEST(FaultInjectionTest, FailingPieceFailsTheWholeMultiPieceRequest) {
  // Piece 3 of 8 of one request fails; the others succeed but the ticket must not.
  this->faults_.add(FaultRule::fail_nth(this->faults_.operations() + 3, ENOSPC));
  Ticket ticket = this->engine_->submit(IoRequest::write(this->file_, 0, this->out_.span()));
  ASSERT_FALSE(ticket.ok());
  EXPECT_LT(ticket.bytes_transferred(), kMiB);
  EXPECT_THROW(ticket.get(), IoError);
  this->faults_.clear();
  EXPECT_TRUE(this->reads_back(0, kMiB));
}

TYPED_TEST(FaultInjectionTest, PathRuleFailsEveryWriteOnThatFileOnly) {
  const FileId bad = this->engine_->open_file(this->dir_ / "bad-drive.bin", kMiB);
  this->faults_.add(FaultRule::fail_path("bad-drive", EROFS, IoOp::kWrite));
  for (int i = 0; i < 3; ++i) {
    Ticket failed = this->engine_->submit(IoRequest::write(bad, 0, this->out_.span()));
    ASSERT_FALSE(failed.ok());
    try {
      failed.get();
    } catch (const IoError& error) {
      EXPECT_EQ(error.code().value(), EROFS);
      EXPECT_NE(error.path().find("bad-drive.bin"), std::string::npos);
    }
  }
  // Reads of that file and writes of the other still work.
  this->engine_->submit(IoRequest::read(bad, 0, this->in_.span())).get();
  this->engine_->submit(IoRequest::write(this->file_, 0, this->out_.span())).get();
  EXPECT_TRUE(this->reads_back(0, kMiB));
}

TYPED_TEST(FaultInjectionTest, ShortReadsAndWritesAreResubmittedForTheRest) {
  const std::uint64_t first = this->faults_.operations() + 1;
  this->faults_.add(FaultRule::short_nth(first));
  this->faults_.add(FaultRule::short_nth(first + 1));
  // One piece of one block: shortened once, then again on its remainder.
  Ticket written = this->engine_->submit(
      IoRequest::write(this->file_, kBlock, this->out_.span().subspan(kBlock, kBlock)));
  written.get();
  EXPECT_EQ(written.bytes_transferred(), kBlock);
  EXPECT_EQ(this->faults_.events().size(), 2U);
  EXPECT_EQ(this->faults_.operations() - first + 1, 3U) << "two short transfers, one remainder";

  this->faults_.add(FaultRule::short_nth(this->faults_.operations() + 1));
  EXPECT_TRUE(this->reads_back(kBlock, kBlock));
  EXPECT_EQ(this->faults_.events().size(), 3U);
}

TYPED_TEST(FaultInjectionTest, EagainAndEintrAreRetried) {
  const std::uint64_t first = this->faults_.operations() + 1;
  this->faults_.add(FaultRule::fail_nth(first, EAGAIN));
  this->faults_.add(FaultRule::fail_nth(first + 1, EINTR));
  EXPECT_TRUE(this->reads_back(0, kBlock));
  EXPECT_EQ(this->faults_.events().size(), 2U);
}

TYPED_TEST(FaultInjectionTest, FlippedByteIsSilentLikeMediaCorruption) {
  // By design the engine cannot see it: checksums above io/ must. Prove the flip is real and
  // single.
  this->faults_.add(FaultRule::flip_nth_read(this->faults_.operations() + 1));
  std::memset(this->in_.data(), 0, kBlock);
  Ticket read =
      this->engine_->submit(IoRequest::read(this->file_, 0, this->in_.span().first(kBlock)));
  EXPECT_TRUE(read.ok());
  std::size_t differing = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    differing += this->in_.data()[i] != this->out_.data()[i] ? 1 : 0;
  }
  EXPECT_EQ(differing, 1U);
  ASSERT_EQ(this->faults_.events().size(), 1U);
  EXPECT_EQ(this->faults_.events()[0].kind, FaultKind::kFlipByteOnRead);
}

TYPED_TEST(FaultInjectionTest, NoTicketEverReportsSuccessWithWrongBytes) {
  const std::uint64_t seed = 0x5eed0003;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 random(seed);
  // Random errnos, retries and short transfers over the next few hundred operations.
  const std::uint64_t base = this->faults_.operations();
  for (int i = 0; i < 60; ++i) {
    const std::uint64_t n = base + 1 + random() % 400;
    switch (random() % 4) {
      case 0:
        this->faults_.add(FaultRule::fail_nth(n, EIO));
        break;
      case 1:
        this->faults_.add(FaultRule::fail_nth(n, EAGAIN));
        break;
      default:
        this->faults_.add(FaultRule::short_nth(n));
        break;
    }
  }
  constexpr std::uint64_t kSlot = 32 * kKiB;
  constexpr std::uint64_t kSlots = kMiB / kSlot;
  AlignedBuffer fresh = AlignedBuffer::allocate(kMiB);
  for (int round = 0; round < 4; ++round) {
    // New bytes every round, so a stale slot from an earlier round cannot pass for a fresh one.
    testing::fill_random(fresh.span(), seed + static_cast<std::uint64_t>(round));
    std::vector<Ticket> writes;
    for (std::uint64_t s = 0; s < kSlots; ++s) {
      writes.push_back(this->engine_->submit(
          IoRequest::write(this->file_, s * kSlot, fresh.span().subspan(s * kSlot, kSlot))));
    }
    std::vector<bool> written(kSlots);
    for (std::uint64_t s = 0; s < kSlots; ++s) {
      written[s] = writes[s].ok();
    }
    std::vector<Ticket> reads;
    for (std::uint64_t s = 0; s < kSlots; ++s) {
      reads.push_back(this->engine_->submit(
          IoRequest::read(this->file_, s * kSlot, this->in_.span().subspan(s * kSlot, kSlot))));
    }
    for (std::uint64_t s = 0; s < kSlots; ++s) {
      if (written[s] && reads[s].ok()) {
        EXPECT_EQ(reads[s].bytes_transferred(), kSlot);
        ASSERT_EQ(std::memcmp(this->in_.data() + s * kSlot, fresh.data() + s * kSlot, kSlot), 0)
            << "round " << round << " slot " << s << " reported success with wrong bytes";
      }
    }
  }
  EXPECT_GT(this->faults_.events().size(), 10U);
}

}  // namespace
}  // namespace strata::io
