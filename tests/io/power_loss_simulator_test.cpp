// Proves the power-loss simulator's model: fsynced bytes and fsynced directory entries always
// survive; un-fsynced writes are dropped or kept at random, the last kept one torn at a 512-byte
// sector; an entry created or renamed without a directory fsync may be undone; an atomic file
// write shows the old file or the whole new one; engine writes are recorded; the same seed gives
// the same image.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/aligned_buffer.hpp"
#include "io/file_handle.hpp"
#include "io/namespace_ops.hpp"
#include "io/posix_engine.hpp"
#include "io/power_loss_simulator.hpp"
#include "io/whole_file.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::io {
namespace {

using testing::ScratchDir;

constexpr std::uint64_t kTrials = 300;

std::string read_text(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = read_file_bytes(path);
  return {bytes.begin(), bytes.end()};
}

std::span<const std::byte> as_bytes(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// The name of file `i`.
std::string numbered(const char* prefix, int i) {
  std::string name = prefix;
  name += std::to_string(i);
  return name;
}

// The bytes of the file `path` in `image`, or nullopt when the image has no such file.
std::optional<std::string> file_in(const CrashImage& image, const std::filesystem::path& path) {
  const auto found = image.find(path);
  if (found == image.end() || found->second.directory) return std::nullopt;
  const auto* first = reinterpret_cast<const char*>(found->second.bytes.data());
  return std::string(first, found->second.bytes.size());
}

// A fresh target for one crash image, beside the recorded root.
std::filesystem::path image_path(const ScratchDir& images, std::uint64_t trial) {
  std::string name = "image-";
  name += std::to_string(trial);
  return images.path() / name;
}

TEST(PowerLossSimulator, FsyncedBytesAlwaysSurviveAndLaterWritesAreKeptDroppedOrTorn) {
  ScratchDir root;
  const std::string durable(2048, 'd');
  const std::string later(1536, 'n');  // three sectors
  PowerLossSimulator simulator(root.path());
  {
    const FileHandle file = FileHandle::open(root / "f", {CreateMode::kCreate, DirectIo::kOff});
    file.write_at(0, as_bytes(durable));
    file.sync();
    sync_directory(root.path());
    file.write_at(512, as_bytes(later));
  }
  std::set<std::size_t> torn_lengths;
  std::uint64_t dropped = 0;
  std::uint64_t kept = 0;
  for (std::uint64_t seed = 0; seed < kTrials; ++seed) {
    CrashReport report;
    const CrashImage image = simulator.crash_image(simulator.operations(), seed, report);
    const std::string after = file_in(image, "f").value();
    SCOPED_TRACE("seed " + std::to_string(seed));
    ASSERT_EQ(after.size(), durable.size());
    // The image is the durable bytes with a prefix of the later write over them.
    const std::size_t first_old = after.find_first_not_of('n', 512);
    const std::size_t landed = (first_old == std::string::npos ? after.size() : first_old) - 512;
    ASSERT_EQ(after.substr(0, 512), durable.substr(0, 512));
    ASSERT_EQ(after.substr(512 + landed), durable.substr(512 + landed));
    ASSERT_EQ(landed % 512, 0u) << "a torn write lands in whole sectors";
    EXPECT_EQ(report.writes_pending, 1u);
    dropped += report.writes_dropped;
    kept += landed == later.size() ? 1 : 0;
    if (report.writes_torn != 0) torn_lengths.insert(landed);
  }
  EXPECT_GT(dropped, 0u);
  EXPECT_GT(kept, 0u);
  EXPECT_TRUE(torn_lengths.contains(512) || torn_lengths.contains(1024))
      << "some torn write lands part of its sectors";
}

TEST(PowerLossSimulator, ACreateWithoutADirectoryFsyncMayVanishAndWithOneAlwaysStays) {
  ScratchDir root;
  PowerLossSimulator simulator(root.path());
  const auto create = [&](const char* name) {
    const FileHandle file = FileHandle::open(root / name, {CreateMode::kCreate, DirectIo::kOff});
    file.write_at(0, as_bytes("x"));
    file.sync();  // the data is durable; the entry is the directory's business
  };
  create("synced");
  sync_directory(root.path());
  create("unsynced");
  std::uint64_t vanished = 0;
  for (std::uint64_t seed = 0; seed < kTrials; ++seed) {
    CrashReport report;
    const CrashImage image = simulator.crash_image(simulator.operations(), seed, report);
    ASSERT_EQ(file_in(image, "synced"), "x") << "seed " << seed;
    const std::optional<std::string> unsynced = file_in(image, "unsynced");
    const bool present = unsynced.has_value();
    EXPECT_EQ(report.entries_undone, present ? 0u : 1u) << "seed " << seed;
    if (present) {
      EXPECT_EQ(*unsynced, "x");
    }
    vanished += present ? 0 : 1;
  }
  EXPECT_GT(vanished, 0u);
  EXPECT_LT(vanished, kTrials);
}

TEST(PowerLossSimulator, AnAtomicFileWriteShowsTheOldFileOrTheWholeNewOne) {
  ScratchDir root;
  write_file_atomically(root / "manifest", std::string(3000, 'o'));
  PowerLossSimulator simulator(root.path());  // the old file is durable
  const std::string next(5000, 'N');
  write_file_atomically(root / "manifest", next);
  const std::uint64_t total = simulator.operations();
  ASSERT_GE(total, 5u);  // create, write, fsync, rename, directory fsync
  std::set<std::string> seen;
  for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
    const std::uint64_t crash_at = trial % (total + 1);
    CrashReport report;
    const std::string after =
        file_in(simulator.crash_image(crash_at, trial, report), "manifest").value_or("(none)");
    ASSERT_TRUE(after == std::string(3000, 'o') || after == next)
        << "trial " << trial << ": a torn manifest of " << after.size() << " bytes after "
        << crash_at << " of " << total << " operations";
    seen.insert(after);
    if (crash_at == total) {
      EXPECT_EQ(after, next) << "the directory fsync made it durable";
    }
  }
  EXPECT_EQ(seen.size(), 2u);
}

TEST(PowerLossSimulator, AnUnsyncedRenameLeavesTheOldNameOrTheNewNeverBothOrNeither) {
  ScratchDir root;
  ScratchDir images;
  io::make_directories(root / "ckpt.tmp");
  write_file_atomically(root / "ckpt.tmp" / "m", "m");
  sync_directory(root.path());
  PowerLossSimulator simulator(root.path());
  rename_entry(root / "ckpt.tmp", root / "ckpt");
  std::uint64_t undone = 0;
  for (std::uint64_t seed = 0; seed < kTrials; ++seed) {
    CrashReport report;
    const CrashImage image = simulator.crash_image(simulator.operations(), seed, report);
    const bool old_name = file_in(image, "ckpt.tmp/m") == "m";
    const bool new_name = file_in(image, "ckpt/m") == "m";
    ASSERT_NE(old_name, new_name) << "seed " << seed;
    undone += old_name ? 1 : 0;
  }
  EXPECT_GT(undone, 0u);
  EXPECT_LT(undone, kTrials);
  sync_directory(root.path());
  simulator.write_crash_image(simulator.operations(), 0, images / "synced");
  EXPECT_TRUE(std::filesystem::exists(images / "synced" / "ckpt" / "m"));
  EXPECT_FALSE(std::filesystem::exists(images / "synced" / "ckpt.tmp"));
}

TEST(PowerLossSimulator, EngineWritesAndFsyncsAreRecorded) {
  ScratchDir root;
  ScratchDir images;
  PowerLossSimulator simulator(root.path());
  std::string pattern(8192, '\0');
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>('a' + i % 26);
  {
    IoEngineOptions options;
    options.kind = IoEngineKind::kPosix;
    options.block_size_bytes = 4096;
    options.queue_depth = 2;
    options.direct = DirectIo::kOff;
    PosixEngine engine(options);
    const FileId file = engine.open_file(root / "swap", pattern.size());
    const IoRequest write = IoRequest::write(file, 0, as_bytes(pattern));
    engine.submit(write).get();
    engine.sync(file).get();
  }
  sync_directory(root.path());
  const std::vector<FileOp> log = simulator.log();
  std::uint64_t written = 0;
  for (const FileOp& op : log) written += op.kind == FileOpKind::kWrite ? op.data.size() : 0;
  EXPECT_EQ(written, pattern.size()) << "two 4 KiB pieces";
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const CrashReport report =
        simulator.write_crash_image(simulator.operations(), seed, image_path(images, seed));
    EXPECT_EQ(report.writes_pending, 0u);
    EXPECT_EQ(read_text(image_path(images, seed) / "swap"), pattern) << "seed " << seed;
  }
}

TEST(PowerLossSimulator, TheSameSeedGivesTheSameImage) {
  ScratchDir root;
  ScratchDir images;
  PowerLossSimulator simulator(root.path());
  for (int i = 0; i < 8; ++i) {
    const FileHandle file =
        FileHandle::open(root / numbered("f", i), {CreateMode::kCreate, DirectIo::kOff});
    file.write_at(0, as_bytes(std::string(1024 + 512 * i, static_cast<char>('a' + i))));
  }
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const auto listing = [&](const std::filesystem::path& image) {
      std::string all;
      for (int i = 0; i < 8; ++i) {
        const std::filesystem::path file = image / numbered("f", i);
        all += std::filesystem::exists(file) ? read_text(file) : "-";
        all += '|';
      }
      return all;
    };
    simulator.write_crash_image(simulator.operations(), seed, images / "a");
    simulator.write_crash_image(simulator.operations(), seed, images / "b");
    EXPECT_EQ(listing(images / "a"), listing(images / "b")) << "seed " << seed;
    std::filesystem::remove_all(images / "a");
    std::filesystem::remove_all(images / "b");
  }
}

TEST(PowerLossSimulator, ATargetInsideTheRootOrACrashPastTheLogIsRefused) {
  ScratchDir root;
  PowerLossSimulator simulator(root.path());
  EXPECT_THROW(simulator.write_crash_image(0, 0, root / "image"), std::invalid_argument);
  EXPECT_THROW(simulator.write_crash_image(1, 0, root.path().parent_path() / "never"),
               std::invalid_argument);
}

}  // namespace
}  // namespace strata::io
