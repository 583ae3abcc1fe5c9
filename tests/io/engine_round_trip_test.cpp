// Proves every engine configuration (io_uring/POSIX x O_DIRECT/buffered) writes and reads back
// exact bytes over many sizes and offsets, single-file and striped, with and without fixed buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "io/buffer_pool.hpp"
#include "io/striped_file.hpp"
#include "io_test_support.hpp"

namespace strata::io {
namespace {

using testing::AllConfigs;
using testing::ConfigNames;
using testing::ScratchDir;

constexpr std::uint64_t kBlock = 64 * kKiB;

template <class C>
class EngineRoundTripTest : public ::testing::Test {
 protected:
  void SetUp() override { start({}); }

  void start(IoEngineOptions options) {
    options.block_size_bytes = kBlock;
    options.queue_depth = 8;
    options.rings = 2;
    engine_.reset();
    std::string skip;
    engine_ = testing::make_test_engine<C>(options, dir_, skip);
    if (!engine_) {
      GTEST_SKIP() << skip;
    }
  }
  bool direct() const { return C::direct == DirectIo::kOn; }
  // Sizes and offsets the file system allows: 4 KiB multiples with O_DIRECT, anything otherwise.
  std::uint64_t granule() const { return direct() ? kDirectIoAlignment : 1; }

  ScratchDir dir_;
  std::unique_ptr<IoEngine> engine_;
};
TYPED_TEST_SUITE(EngineRoundTripTest, AllConfigs, ConfigNames);

TYPED_TEST(EngineRoundTripTest, SingleFileManySizesAndOffsets) {
  const std::uint64_t seed = 0x5eed0001;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::uint64_t file_bytes = 8 * kMiB;
  const FileId file = this->engine_->open_file(this->dir_ / "single.bin", file_bytes);
  const std::uint64_t g = this->granule();
  // Whole blocks, partial blocks, one byte past a block, many blocks, in granules.
  const std::vector<std::uint64_t> sizes = {1,   2,   3,   16,  17,   63,   64,   65,
                                            100, 256, 257, 513, 1000, 1023, 1024, 1025};
  std::mt19937_64 random(seed);
  AlignedBuffer expected = AlignedBuffer::allocate(5 * kMiB);
  AlignedBuffer actual = AlignedBuffer::allocate(5 * kMiB);
  for (std::uint64_t units : sizes) {
    const std::uint64_t length = this->direct() ? units * kDirectIoAlignment : units * 997;
    ASSERT_LE(length, expected.size());
    const std::uint64_t offset = random() % ((file_bytes - length) / g) * g;
    SCOPED_TRACE(::testing::Message() << "offset " << offset << " length " << length);
    testing::fill_random(expected.span().first(length), random());
    std::memset(actual.data(), 0xA5, length);

    Ticket written =
        this->engine_->submit(IoRequest::write(file, offset, expected.span().first(length)));
    written.get();
    EXPECT_EQ(written.bytes_transferred(), length);
    Ticket read = this->engine_->submit(IoRequest::read(file, offset, actual.span().first(length)));
    read.get();
    EXPECT_EQ(read.bytes_transferred(), length);
    ASSERT_EQ(std::memcmp(expected.data(), actual.data(), length), 0);
  }
}

TYPED_TEST(EngineRoundTripTest, BatchOfRequestsIsOneTicket) {
  const FileId a = this->engine_->open_file(this->dir_ / "a.bin", kMiB);
  const FileId b = this->engine_->open_file(this->dir_ / "b.bin", kMiB);
  AlignedBuffer out = AlignedBuffer::allocate(512 * kKiB);
  AlignedBuffer in = AlignedBuffer::allocate(512 * kKiB);
  testing::fill_random(out.span(), 7);
  const std::vector<IoRequest> writes = {
      IoRequest::write(a, 0, out.span().first(256 * kKiB)),
      IoRequest::write(b, 256 * kKiB, out.span().subspan(256 * kKiB))};
  Ticket written = this->engine_->submit(writes);
  written.get();
  EXPECT_EQ(written.bytes_transferred(), 512 * kKiB);
  const std::vector<IoRequest> reads = {
      IoRequest::read(a, 0, in.span().first(256 * kKiB)),
      IoRequest::read(b, 256 * kKiB, in.span().subspan(256 * kKiB))};
  this->engine_->submit(reads).get();
  EXPECT_EQ(std::memcmp(out.data(), in.data(), in.size()), 0);
  Ticket synced = this->engine_->sync(a);
  synced.get();
  EXPECT_TRUE(synced.poll());
}

TYPED_TEST(EngineRoundTripTest, EmptyRequestCompletesAtOnce) {
  const FileId file = this->engine_->open_file(this->dir_ / "empty.bin", 0);
  Ticket ticket = this->engine_->submit(IoRequest::read(file, 0, {}));
  EXPECT_TRUE(ticket.poll());
  EXPECT_TRUE(ticket.ok());
  EXPECT_EQ(ticket.bytes_transferred(), 0U);
}

TYPED_TEST(EngineRoundTripTest, StripedRangesCrossUnitsAndFiles) {
  const std::uint64_t seed = 0x5eed0002;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::uint64_t logical_bytes = 6 * kMiB;
  // A stripe unit that is not the block size, so units and pieces do not line up.
  const std::uint64_t unit = 48 * kKiB;
  const std::vector<std::filesystem::path> paths = {this->dir_ / "s0", this->dir_ / "s1",
                                                    this->dir_ / "s2"};
  StripedFile striped = StripedFile::create(*this->engine_, paths, logical_bytes, unit);
  ASSERT_EQ(striped.files().size(), 3U);
  EXPECT_EQ(striped.locate(0).file_index, 0U);
  EXPECT_EQ(striped.locate(unit).file_index, 1U);
  EXPECT_EQ(striped.locate(3 * unit + 5).file_index, 0U);
  EXPECT_EQ(striped.locate(3 * unit + 5).offset_bytes, unit + 5);

  // Fill the whole space in one request: every drive at once.
  AlignedBuffer whole = AlignedBuffer::allocate(logical_bytes);
  testing::fill_random(whole.span(), seed);
  striped.write(0, whole.span()).get();
  striped.sync().get();

  std::mt19937_64 random(seed);
  AlignedBuffer actual = AlignedBuffer::allocate(logical_bytes);
  const std::uint64_t g = this->granule();
  for (int i = 0; i < 24; ++i) {
    const std::uint64_t length = (1 + random() % (logical_bytes / 4 / g)) * g;
    const std::uint64_t offset = random() % ((logical_bytes - length) / g + 1) * g;
    SCOPED_TRACE(::testing::Message() << "offset " << offset << " length " << length);
    Ticket read = striped.read(offset, actual.span().first(length));
    read.get();
    EXPECT_EQ(read.bytes_transferred(), length);
    ASSERT_EQ(std::memcmp(whole.data() + offset, actual.data(), length), 0);
  }
  // Each file holds its share: file 1 starts with logical unit 1.
  const FileId file1 = striped.files()[1];
  AlignedBuffer direct_head = AlignedBuffer::allocate(unit);
  this->engine_->submit(IoRequest::read(file1, 0, direct_head.span().first(unit))).get();
  EXPECT_EQ(std::memcmp(direct_head.data(), whole.data() + unit, unit), 0);
}

TYPED_TEST(EngineRoundTripTest, FixedBuffersRoundTrip) {
  BufferPool pool(4, 256 * kKiB);
  IoEngineOptions options;
  options.fixed_buffers = pool.buffers();
  this->start(options);
  if (this->IsSkipped()) {
    return;
  }
  const FileId file = this->engine_->open_file(this->dir_ / "fixed.bin", kMiB);
  BufferPool::Lease out = pool.acquire();
  BufferPool::Lease in = pool.acquire();
  testing::fill_random(out.span(), 11);
  this->engine_->submit(IoRequest::write(file, 256 * kKiB, out.span(), out.index())).get();
  // A sub-range of a fixed buffer is still the fixed buffer.
  this->engine_->submit(IoRequest::read(file, 256 * kKiB, in.span().first(128 * kKiB), in.index()))
      .get();
  this->engine_
      ->submit(IoRequest::read(file, 384 * kKiB, in.span().subspan(128 * kKiB), in.index()))
      .get();
  EXPECT_EQ(std::memcmp(out.data(), in.data(), out.size()), 0);
}

TYPED_TEST(EngineRoundTripTest, ReadPastEndOfFileFailsWithPath) {
  const FileId file = this->engine_->open_file(this->dir_ / "short.bin", 64 * kKiB);
  AlignedBuffer buffer = AlignedBuffer::allocate(128 * kKiB);
  Ticket read = this->engine_->submit(IoRequest::read(file, 0, buffer.span()));
  ASSERT_FALSE(read.ok());
  try {
    read.get();
    FAIL() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), ENODATA);
    EXPECT_EQ(error.operation(), "read");
    EXPECT_NE(std::string(error.what()).find("short.bin"), std::string::npos) << error.what();
    EXPECT_EQ(error.offset_bytes(), 64 * kKiB);
  }
  // The engine is still usable.
  this->engine_->submit(IoRequest::read(file, 0, buffer.span().first(64 * kKiB))).get();
}

}  // namespace
}  // namespace strata::io
