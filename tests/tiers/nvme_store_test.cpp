// Proves the NVMe store's crash safety: committed steps survive reopening, uncommitted writes and
// injected failures at every point of a commit never expose half a step, checksums catch flipped
// bytes, a failed manifest fsync never lets a possibly-durable manifest name overwritten slots,
// opening falls back past a manifest whose slots fail their checksums, opening fsyncs its
// directories, and a store from another layout or rank count is refused with a clear error.
#include "tiers/nvme_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/aligned_buffer.hpp"
#include "io/fault_injector.hpp"
#include "io/io_error.hpp"
#include "io/make_engine.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::tiers {
namespace {

using io::testing::ScratchDir;
using ::testing::HasSubstr;

const std::vector<ExtentSpec> kExtents = {
    {"embed/master", 10'000}, {"h.0/master", 4096}, {"h.0/exp_avg", 70'000}, {"tiny", 3}};

std::unique_ptr<io::IoEngine> make_test_engine(io::FaultInjector* faults = nullptr) {
  io::IoEngineOptions options;
  options.kind = io::IoEngineKind::kAuto;
  options.block_size_bytes = 16 * 1024;  // several pieces per extent
  options.queue_depth = 8;
  options.direct = io::DirectIo::kOn;
  options.faults = faults;
  return io::make_io_engine(options);
}

// Deterministic content of `extent` at `step`.
io::AlignedBuffer content(const NvmeStore& store, ExtentId extent, std::uint64_t step) {
  io::AlignedBuffer buffer = io::AlignedBuffer::allocate(store.slot_bytes(extent));
  std::mt19937_64 random(step * 1000 + extent);
  for (std::size_t i = 0; i < store.extent(extent).length_bytes; ++i) {
    buffer.data()[i] = static_cast<std::byte>(random());
  }
  return buffer;
}

void write_step(NvmeStore& store, std::uint64_t step) {
  std::vector<io::AlignedBuffer> buffers;
  std::vector<io::Ticket> tickets;
  for (ExtentId id = 0; id < store.extent_count(); ++id) {
    buffers.push_back(content(store, id, step));
    tickets.push_back(store.write(id, buffers.back().span()));
  }
  for (io::Ticket& ticket : tickets) ticket.wait();
}

// True when every extent reads back exactly as written at `step`.
bool holds_step(NvmeStore& store, std::uint64_t step) {
  for (ExtentId id = 0; id < store.extent_count(); ++id) {
    io::AlignedBuffer buffer = io::AlignedBuffer::allocate(store.slot_bytes(id));
    store.read(id, buffer.span()).wait();
    const io::AlignedBuffer expected = content(store, id, step);
    if (std::memcmp(buffer.data(), expected.data(), store.extent(id).length_bytes) != 0)
      return false;
  }
  return true;
}

NvmeStoreOptions options_for(const ScratchDir& dir, StoreOpenMode mode, int paths = 1) {
  NvmeStoreOptions options;
  for (int i = 0; i < paths; ++i) {
    options.paths.push_back(dir / ("drive" + std::to_string(i)));
    std::filesystem::create_directories(options.paths.back());
  }
  options.mode = mode;
  return options;
}

TEST(NvmeStore, CommittedStepSurvivesReopen) {
  ScratchDir dir;
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate, 2), kExtents);
    EXPECT_FALSE(store.resumed());
    EXPECT_FALSE(store.committed_step().has_value());
    write_step(store, 0);
    EXPECT_TRUE(holds_step(store, 0));  // reads its own uncommitted writes
    store.commit(0);
    EXPECT_EQ(store.committed_step(), 0u);
  }
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume, 2), kExtents);
  EXPECT_TRUE(store.resumed());
  EXPECT_EQ(store.committed_step(), 0u);
  EXPECT_TRUE(holds_step(store, 0));
}

// read_cache_bytes: extents written while room is left (first written first: whole slots) are
// read from their copies, the rest from the drives; every write still reaches the drives, so a
// reopened store (no cache) holds the committed step.
TEST(NvmeStore, ReadCacheServesTheFirstWrittenExtentsAndTheDrivesStillHoldEverything) {
  ScratchDir dir;
  {
    auto engine = make_test_engine();
    NvmeStoreOptions options = options_for(dir, StoreOpenMode::kCreate);
    options.read_cache_bytes = 16 * 1024;  // slots of 12 KiB, 4 KiB, 72 KiB, 4 KiB: 0 and 1 fit
    NvmeStore store(*engine, options, kExtents);
    write_step(store, 0);
    store.commit(0);
    write_step(store, 1);  // replaces the cached bytes too
    const std::uint64_t drive_reads = store.bytes_read();
    EXPECT_TRUE(holds_step(store, 1));
    EXPECT_EQ(store.read_cache_bytes_used(), store.slot_bytes(0) + store.slot_bytes(1));
    EXPECT_EQ(store.bytes_read_from_cache(), store.slot_bytes(0) + store.slot_bytes(1));
    EXPECT_EQ(store.bytes_read() - drive_reads, store.slot_bytes(2) + store.slot_bytes(3));
    store.commit(1);
  }
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
  EXPECT_EQ(store.committed_step(), 1u);
  EXPECT_TRUE(holds_step(store, 1));
  EXPECT_EQ(store.bytes_read_from_cache(), 0u);
}

// discard (what undoes a speculative optimizer update): the extent's newest bytes are the
// committed ones again, its cached copy goes, the next write and commit work as before, and a
// discarded write is never committed.
TEST(NvmeStore, DiscardMakesTheCommittedBytesTheNewestAgain) {
  ScratchDir dir;
  {
    auto engine = make_test_engine();
    NvmeStoreOptions options = options_for(dir, StoreOpenMode::kCreate);
    options.read_cache_bytes = 16 * 1024;  // extents 0 and 1 cached
    NvmeStore store(*engine, options, kExtents);
    write_step(store, 0);
    store.commit(0);
    write_step(store, 1);
    for (ExtentId id = 0; id < store.extent_count(); ++id) {
      EXPECT_TRUE(store.has_pending(id));
      store.discard(id);
      EXPECT_FALSE(store.has_pending(id));
    }
    EXPECT_EQ(store.read_cache_bytes_used(), 0u);
    EXPECT_TRUE(holds_step(store, 0));
    write_step(store, 2);
    EXPECT_TRUE(holds_step(store, 2));
    store.write(0, content(store, 0, 3).span()).wait();
    store.discard(0);  // one extent undone: it keeps step 0's bytes, the others step 2's
    store.commit(2);
    io::AlignedBuffer buffer = io::AlignedBuffer::allocate(store.slot_bytes(0));
    store.read(0, buffer.span()).wait();
    EXPECT_EQ(std::memcmp(buffer.data(), content(store, 0, 0).data(), store.extent(0).length_bytes),
              0);
  }
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
  EXPECT_EQ(store.committed_step(), 2u);
  for (ExtentId id = 1; id < store.extent_count(); ++id) {
    io::AlignedBuffer buffer = io::AlignedBuffer::allocate(store.slot_bytes(id));
    store.read(id, buffer.span()).wait();
    EXPECT_EQ(
        std::memcmp(buffer.data(), content(store, id, 2).data(), store.extent(id).length_bytes), 0)
        << "extent " << id;
  }
}

TEST(NvmeStore, UncommittedWritesAreInvisibleAfterReopen) {
  ScratchDir dir;
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
    write_step(store, 0);
    store.commit(0);
    write_step(store, 1);
    store.commit(1);
    write_step(store, 2);  // a crash now: step 2 written to the free slots, never committed
  }
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreateOrResume), kExtents);
  EXPECT_EQ(store.committed_step(), 1u);
  EXPECT_TRUE(holds_step(store, 1));
  // And the store goes on from there: slots alternate correctly after a resume.
  write_step(store, 2);
  store.commit(2);
  write_step(store, 3);
  EXPECT_TRUE(holds_step(store, 3));
}

// An injected failure at every I/O operation of a commit (data writes, data fsyncs, manifest
// write, manifest fsync): the store reopens holding exactly step 1 or exactly step 2, never a mix,
// and exactly step 2 whenever commit(2) reported success.
TEST(NvmeStore, FailureAtEveryPointOfACommitLosesNothing) {
  std::uint64_t operations_in_commit = 0;
  for (std::uint64_t nth = 1;; ++nth) {
    SCOPED_TRACE("failing operation " + std::to_string(nth));
    ScratchDir dir;
    {
      auto engine = make_test_engine();
      NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate, 2), kExtents);
      write_step(store, 1);
      store.commit(1);
    }
    io::FaultInjector faults;
    bool committed = false;
    bool fault_fired = false;
    {
      auto engine = make_test_engine(&faults);
      NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume, 2), kExtents);
      // Count from the first operation after opening (which read the manifests).
      faults.add(io::FaultRule::fail_nth(faults.operations() + nth, EIO));
      try {
        write_step(store, 2);
        store.commit(2);
        committed = true;
      } catch (const std::exception& error) {
        EXPECT_THAT(error.what(), HasSubstr("Input/output error"));
      }
      fault_fired = !faults.events().empty();
    }
    auto engine = make_test_engine();
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume, 2), kExtents);
    ASSERT_TRUE(store.committed_step() == 1u || store.committed_step() == 2u);
    if (committed) {
      EXPECT_EQ(store.committed_step(), 2u);
    }
    EXPECT_TRUE(holds_step(store, *store.committed_step()));
    if (!fault_fired) {
      operations_in_commit = nth - 1;
      break;
    }
  }
  EXPECT_GE(operations_in_commit, 8u) << "the loop must have covered a whole commit";
}

TEST(NvmeStore, FlippedBytesAreCaughtByChecksum) {
  ScratchDir dir;
  NvmeStoreOptions options = options_for(dir, StoreOpenMode::kCreate);
  std::filesystem::path swap;
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options, kExtents);
    write_step(store, 5);
    store.commit(5);
    swap = store.swap_files().front();
  }
  // Flip one byte of extent 0, slot A, directly on disk.
  {
    const int fd = ::open(swap.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, 100), 1);
    byte = static_cast<char>(~byte);
    ASSERT_EQ(::pwrite(fd, &byte, 1, 100), 1);
    ::close(fd);
  }
  options.mode = StoreOpenMode::kResume;
  auto engine = make_test_engine();
  NvmeStore store(*engine, options, kExtents);
  io::AlignedBuffer buffer = io::AlignedBuffer::allocate(store.slot_bytes(0));
  try {
    store.read(0, buffer.span()).wait();
    FAIL() << "corrupt bytes were accepted";
  } catch (const StoreCorruption& error) {
    EXPECT_THAT(error.what(), HasSubstr("extent 'embed/master' slot A"));
    EXPECT_THAT(error.what(), HasSubstr(swap.string()));
    EXPECT_THAT(error.what(), HasSubstr("step 5"));
  }
  // Other extents are still readable.
  io::AlignedBuffer other = io::AlignedBuffer::allocate(store.slot_bytes(1));
  EXPECT_NO_THROW(store.read(1, other.span()).wait());
}

TEST(NvmeStore, FlipOnReadInjectedIsCaught) {
  ScratchDir dir;
  io::FaultInjector faults;
  auto engine = make_test_engine(&faults);
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
  write_step(store, 0);
  store.commit(0);
  faults.add(
      io::FaultRule{std::nullopt, "", io::IoOp::kRead, io::FaultKind::kFlipByteOnRead, 0, 1});
  io::AlignedBuffer buffer = io::AlignedBuffer::allocate(store.slot_bytes(2));
  EXPECT_THROW(store.read(2, buffer.span()).wait(), StoreCorruption);
  EXPECT_NO_THROW(store.read(2, buffer.span()).wait());  // the fault fired once; the data is fine
}

TEST(NvmeStore, AnotherShapeOrRankCountIsRefused) {
  ScratchDir dir;
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
    write_step(store, 0);
    store.commit(0);
  }
  auto engine = make_test_engine();
  std::vector<ExtentSpec> bigger = kExtents;
  bigger[2].length_bytes *= 2;
  try {
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), bigger);
    FAIL() << "another shape was accepted";
  } catch (const StoreMismatch& error) {
    EXPECT_THAT(error.what(), HasSubstr("'h.0/exp_avg' of 70000 bytes"));
    EXPECT_THAT(error.what(), HasSubstr("of 140000 bytes"));
  }
  std::vector<ExtentSpec> fewer(kExtents.begin(), kExtents.end() - 1);
  EXPECT_THROW(NvmeStore(*engine, options_for(dir, StoreOpenMode::kResume), fewer), StoreMismatch);
  NvmeStoreOptions two_ranks = options_for(dir, StoreOpenMode::kResume);
  two_ranks.ranks = 2;
  try {
    NvmeStore store(*engine, two_ranks, kExtents);
    FAIL() << "another rank count was accepted";
  } catch (const StoreMismatch& error) {
    EXPECT_THAT(error.what(), HasSubstr("written by rank 0 of 1 ranks; this run is rank 0 of 2"));
  }
}

TEST(NvmeStore, CorruptOrTruncatedManifestsAreReported) {
  ScratchDir dir;
  NvmeStoreOptions options = options_for(dir, StoreOpenMode::kCreate);
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options, kExtents);
    write_step(store, 0);
    store.commit(0);
    write_step(store, 1);
    store.commit(1);  // both manifest copies now hold a valid commit
  }
  options.mode = StoreOpenMode::kResume;
  const std::filesystem::path newest = dir / "drive0" / "strata-rank0.manifest.0";  // sequence 2
  std::filesystem::resize_file(newest, 100);  // truncated: the other copy (step 0) takes over
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options, kExtents);
    EXPECT_EQ(store.committed_step(), 0u);
    EXPECT_TRUE(holds_step(store, 0));
  }
  std::ofstream(dir / "drive0" / "strata-rank0.manifest.1", std::ios::binary | std::ios::trunc)
      << std::string(4096, 'x');
  {
    auto engine = make_test_engine();
    try {
      NvmeStore store(*engine, options, kExtents);
      FAIL() << "corrupt manifests were accepted";
    } catch (const StoreCorruption& error) {
      EXPECT_THAT(error.what(), HasSubstr("strata-rank0.manifest.0: its checksum does not match"));
      EXPECT_THAT(error.what(), HasSubstr("strata-rank0.manifest.1: it does not start with"));
    }
  }
  std::filesystem::resize_file(dir / "drive0" / "strata-rank0.manifest.0", 0);
  std::filesystem::resize_file(dir / "drive0" / "strata-rank0.manifest.1", 10);
  auto engine = make_test_engine();
  try {
    NvmeStore store(*engine, options, kExtents);
    FAIL() << "truncated manifests were accepted";
  } catch (const StoreCorruption& error) {
    EXPECT_THAT(error.what(), HasSubstr("manifest.0: it has 0 bytes, not 4096 (truncated"));
    EXPECT_THAT(error.what(), HasSubstr("manifest.1: it has 10 bytes"));
  }
}

TEST(NvmeStore, ResumeWithoutAStoreIsAnError) {
  ScratchDir dir;
  auto engine = make_test_engine();
  try {
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
    FAIL();
  } catch (const StoreCorruption& error) {
    EXPECT_THAT(error.what(), HasSubstr("no store manifest"));
  }
}

TEST(NvmeStore, TwoStoresOnTheSamePathsAreRefused) {
  ScratchDir dir;
  auto engine = make_test_engine();
  NvmeStore first(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
  write_step(first, 0);
  first.commit(0);
  try {
    NvmeStore second(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
    FAIL() << "a second store truncated the first one's files";
  } catch (const StoreBusy& error) {
    EXPECT_THAT(error.what(), HasSubstr("in use by another strata run"));
  }
  EXPECT_TRUE(holds_step(first, 0));  // untouched
  NvmeStoreOptions other_rank = options_for(dir, StoreOpenMode::kCreate);
  other_rank.rank = 1;
  other_rank.ranks = 2;
  EXPECT_NO_THROW(NvmeStore(*engine, other_rank, kExtents));  // its own files and lock
}

TEST(NvmeStore, MissingPathNamesIt) {
  ScratchDir dir;
  auto engine = make_test_engine();
  NvmeStoreOptions options;
  options.paths = {dir / "no" / "such" / "dir"};
  try {
    NvmeStore store(*engine, options, kExtents);
    FAIL();
  } catch (const std::system_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("no/such/dir/strata-rank0."));
    EXPECT_THAT(error.what(), HasSubstr("No such file or directory"));
  }
}

}  // namespace
}  // namespace strata::tiers

namespace strata::tiers {
namespace {

// A fault injector failing every fsync of a manifest copy until cleared.
io::FaultRule fail_manifest_fsync() {
  return io::FaultRule::fail_path(".manifest.", EIO, io::IoOp::kFsync);
}

// Regression (issue 14): the manifest of step 2 is written but its fsync fails, so the commit
// fails while the manifest may be durable. The run continues and writes step 3 into the free
// slots, which that manifest names, then crashes before committing: the store must reopen at
// step 1, every checksum verifying, not at the half-overwritten step 2.
TEST(NvmeStore, FailedManifestFsyncThenMoreWritesReopensAtThePreviousCommit) {
  ScratchDir dir;
  io::FaultInjector faults;
  {
    auto engine = make_test_engine(&faults);
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
    write_step(store, 1);
    store.commit(1);
    write_step(store, 2);
    faults.add(fail_manifest_fsync());
    EXPECT_THROW(store.commit(2), io::IoError);
    EXPECT_EQ(store.committed_step(), 1u);
    faults.clear();
    write_step(store, 3);  // must not leave a durable manifest naming these slots
  }
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
  EXPECT_EQ(store.committed_step(), 1u);
  EXPECT_TRUE(holds_step(store, 1));
}

// When even the invalidation of the doubtful manifest fails, no slot is written.
TEST(NvmeStore, WritesAfterAFailedManifestFsyncWaitForItsInvalidation) {
  ScratchDir dir;
  io::FaultInjector faults;
  {
    auto engine = make_test_engine(&faults);
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
    write_step(store, 1);
    store.commit(1);
    write_step(store, 2);
    faults.add(fail_manifest_fsync());
    EXPECT_THROW(store.commit(2), io::IoError);
    const std::uint64_t written = store.bytes_written();
    EXPECT_THROW(write_step(store, 3), io::IoError);  // the invalidation's fsync fails too
    EXPECT_EQ(store.bytes_written(), written);
    faults.clear();
    write_step(store, 3);  // invalidated now; the run goes on
    store.commit(3);
  }
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
  EXPECT_EQ(store.committed_step(), 3u);
  EXPECT_TRUE(holds_step(store, 3));
}

// Reopened right after the failed commit, the store is at a consistent step (the manifest did
// reach this disk, and its data was fsynced first: step 2); a retried commit is step 2 as well.
TEST(NvmeStore, FailedManifestFsyncReopensOrRetriesConsistently) {
  for (const bool retry : {false, true}) {
    SCOPED_TRACE(retry ? "retrying the commit" : "reopening at once");
    ScratchDir dir;
    io::FaultInjector faults;
    {
      auto engine = make_test_engine(&faults);
      NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
      write_step(store, 1);
      store.commit(1);
      write_step(store, 2);
      faults.add(fail_manifest_fsync());
      EXPECT_THROW(store.commit(2), io::IoError);
      faults.clear();
      if (retry) {
        store.commit(2);
        EXPECT_EQ(store.committed_step(), 2u);
      }
    }
    auto engine = make_test_engine();
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
    ASSERT_TRUE(store.committed_step() == 1u || store.committed_step() == 2u);
    EXPECT_TRUE(holds_step(store, *store.committed_step()));
    if (retry) {
      EXPECT_EQ(store.committed_step(), 2u);
    }
    // And it goes on: the next step commits and reopens.
    write_step(store, 4);
    store.commit(4);
    EXPECT_TRUE(holds_step(store, 4));
  }
}

// A store committed at step 1 (slot A of every extent) and step 2 (slot B); its first swap file
// and extent 0's slot size.
struct TwoCommits {
  std::filesystem::path swap;
  std::uint64_t slot_bytes = 0;
};
TwoCommits commit_two_steps(const ScratchDir& dir) {
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kCreate), kExtents);
  write_step(store, 1);
  store.commit(1);
  write_step(store, 2);
  store.commit(2);
  return {store.swap_files().front(), store.slot_bytes(0)};
}

// Regression (issue 14): when the newest manifest's slots do not hold its bytes, opening falls
// back to the older manifest (whose slots verify) instead of failing, and the run continues.
TEST(NvmeStore, NewestManifestWithBadSlotsFallsBackToThePreviousOne) {
  ScratchDir dir;
  const auto [swap, slot_bytes] = commit_two_steps(dir);
  {  // extent 0's slot B (step 2) loses its bytes
    const int fd = ::open(swap.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const std::vector<char> zeros(512, 0);
    ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(slot_bytes)), 512);
    ::close(fd);
  }
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
    EXPECT_EQ(store.committed_step(), 1u);
    EXPECT_TRUE(holds_step(store, 1));
    write_step(store, 3);  // into slot B again: the rejected manifest is invalidated first
  }
  {
    auto engine = make_test_engine();
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
    EXPECT_EQ(store.committed_step(), 1u);
    EXPECT_TRUE(holds_step(store, 1));
    write_step(store, 3);
    store.commit(3);
  }
  auto engine = make_test_engine();
  NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
  EXPECT_EQ(store.committed_step(), 3u);
  EXPECT_TRUE(holds_step(store, 3));
}

// When the slots of both commits fail their checksums there is nothing to fall back to: opening
// is an error naming both sequences and the slots that failed.
TEST(NvmeStore, BadSlotsInBothCommitsAreAClearError) {
  ScratchDir dir;
  const auto [swap, slot_bytes] = commit_two_steps(dir);
  {  // extent 0 loses the first bytes of both slots
    const int fd = ::open(swap.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const std::vector<char> zeros(512, 0);
    ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(), 0), 512);
    ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(slot_bytes)), 512);
    ::close(fd);
  }
  auto engine = make_test_engine();
  try {
    NvmeStore store(*engine, options_for(dir, StoreOpenMode::kResume), kExtents);
    FAIL() << "opened a store whose slots all fail their checksums";
  } catch (const StoreCorruption& error) {
    EXPECT_THAT(error.what(), HasSubstr("neither store manifest of rank 0 matches the data"));
    EXPECT_THAT(error.what(), HasSubstr("extent 'embed/master' slot B"));
    EXPECT_THAT(error.what(), HasSubstr("extent 'embed/master' slot A"));
  }
}

// Opening syncs every directory holding its swap files and manifests (so newly created entries
// survive a power loss): failing one directory's fsync fails the open, naming that directory.
TEST(NvmeStore, OpeningFsyncsTheDirectoryOfEverySwapFile) {
  ScratchDir dir;
  const NvmeStoreOptions options = options_for(dir, StoreOpenMode::kCreate, 2);
  for (const std::filesystem::path& failing : options.paths) {
    SCOPED_TRACE(failing.string());
    io::FaultInjector faults;
    faults.add(io::FaultRule::fail_path(failing.string(), EIO, io::IoOp::kFsync));
    auto engine = make_test_engine(&faults);
    try {
      NvmeStore store(*engine, options, kExtents);
      FAIL() << "no fsync of " << failing;
    } catch (const io::IoError& error) {
      EXPECT_THAT(error.what(), HasSubstr(failing.string()));
    }
    const std::vector<io::FaultEvent> events = faults.events();
    ASSERT_EQ(events.size(), 1u);                               // the first failure stops the open
    EXPECT_EQ(std::filesystem::path(events[0].path), failing);  // the directory, not a file
  }
  auto engine = make_test_engine();
  EXPECT_NO_THROW(NvmeStore(*engine, options, kExtents));
}

}  // namespace
}  // namespace strata::tiers
