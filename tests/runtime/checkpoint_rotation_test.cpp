// Proves a checkpoint save crashed at any point never loses the newest complete checkpoint: from
// every directory state a crash can leave, load picks the newest complete one, and the next save
// (itself crashed at any point) removes nothing complete before something newer is in place.
#include "runtime/checkpoint/checkpoint_rotation.hpp"

#include <fstream>
#include <stdexcept>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "io/whole_file.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::runtime::detail {
namespace {

using io::testing::ScratchDir;

std::string read_text(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
  return {bytes.begin(), bytes.end()};
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A fake checkpoint of generation `generation`: a rank file, then (complete only) the manifest.
void stage(const std::filesystem::path& at, int generation, bool complete = true) {
  std::filesystem::create_directories(at);
  write_text(at / "rank00000.bin", fmt::format("shard of generation {}", generation));
  if (complete) write_text(at / "manifest.json", fmt::format("generation {}", generation));
}

// The generation load would see under `dir` (-1: none complete), checking its rank file matches.
int loaded_generation(const std::filesystem::path& dir) {
  const auto found = newest_complete_checkpoint(dir);
  if (!found) return -1;
  const int generation = std::stoi(read_text(*found / "manifest.json").substr(11));
  EXPECT_EQ(read_text(*found / "rank00000.bin"), fmt::format("shard of generation {}", generation))
      << *found;
  return generation;
}

// Directory states a crash can leave (before this fix too), and the generation load must find.
enum class Start {
  kNothing,
  kCurrent,
  kOnlyOld,
  kOnlyCompleteTmp,
  kOldAndCompleteTmp,
  kCurrentAndPartialTmp,
  kCurrentAndCompleteTmp
};

int make_start(const std::filesystem::path& dir, Start start) {
  switch (start) {
    case Start::kNothing:
      return -1;
    case Start::kCurrent:
      stage(dir, 1);
      return 1;
    case Start::kOnlyOld:
      stage(previous_path(dir), 1);
      return 1;
    case Start::kOnlyCompleteTmp:
      stage(staging_path(dir), 2);
      return 2;
    case Start::kOldAndCompleteTmp:
      stage(previous_path(dir), 1);
      stage(staging_path(dir), 2);
      return 2;
    case Start::kCurrentAndPartialTmp:
      stage(dir, 1);
      stage(staging_path(dir), 2, /*complete=*/false);
      return 1;
    case Start::kCurrentAndCompleteTmp:
      stage(previous_path(dir), 0);
      stage(dir, 1);
      stage(staging_path(dir), 2);
      return 2;
  }
  return -1;
}

struct Crash : std::runtime_error {
  Crash() : std::runtime_error("simulated crash") {}
};

// Where the save crashes: nowhere, while staging its files, or after a step of the swap.
enum class CrashAt { kNowhere, kStaging, kOldDiscarded, kCurrentRetired, kNewInPlace };

class CheckpointRotation : public ::testing::TestWithParam<std::tuple<Start, CrashAt>> {};

TEST_P(CheckpointRotation, ACrashAnywhereKeepsTheNewestCompleteCheckpoint) {
  const Start start = std::get<0>(GetParam());
  const CrashAt crash_at = std::get<1>(GetParam());
  ScratchDir scratch;
  const std::filesystem::path dir = scratch.path() / "ckpt";
  const int before = make_start(dir, start);
  ASSERT_EQ(loaded_generation(dir), before);

  // At every step of every swap, the newest complete checkpoint is the one expected then.
  int expected = before;
  bool crashed = false;
  auto hook = [&](PublishStep step) {
    EXPECT_EQ(loaded_generation(dir), expected) << "after step " << static_cast<int>(step);
    if (crash_at != CrashAt::kNowhere && crash_at != CrashAt::kStaging &&
        static_cast<int>(step) == static_cast<int>(crash_at) - 2 && expected == 7 && !crashed) {
      crashed = true;
      throw Crash();
    }
  };
  prepare_staging(dir, hook);  // may publish a complete leftover .tmp, never crashes here
  EXPECT_EQ(loaded_generation(dir), before) << "after prepare_staging";
  stage(staging_path(dir), 7, /*complete=*/crash_at != CrashAt::kStaging);
  if (crash_at == CrashAt::kStaging) {
    EXPECT_EQ(loaded_generation(dir), before) << "a partial .tmp is never loaded";
  } else {
    expected = 7;
    EXPECT_EQ(loaded_generation(dir), 7);
    try {
      publish_checkpoint(dir, hook);  // the first two steps only happen over a complete <dir>
      EXPECT_FALSE(crashed);
    } catch (const Crash&) {
      EXPECT_TRUE(crashed);
    }
    EXPECT_EQ(loaded_generation(dir), 7) << "after the crash";
  }

  // The next save, from whatever the crash left, completes and cleans up.
  const int after_crash = loaded_generation(dir);
  expected = after_crash;
  prepare_staging(dir, hook);
  EXPECT_EQ(loaded_generation(dir), after_crash);
  stage(staging_path(dir), 8);
  expected = 8;
  publish_checkpoint(dir, hook);
  EXPECT_EQ(loaded_generation(dir), 8);
  EXPECT_EQ(read_text(dir / "manifest.json"), "generation 8");
  EXPECT_FALSE(std::filesystem::exists(staging_path(dir)));
  EXPECT_FALSE(std::filesystem::exists(previous_path(dir)));
}

INSTANTIATE_TEST_SUITE_P(
    EveryStartAndCrashPoint, CheckpointRotation,
    ::testing::Combine(::testing::Values(Start::kNothing, Start::kCurrent, Start::kOnlyOld,
                                         Start::kOnlyCompleteTmp, Start::kOldAndCompleteTmp,
                                         Start::kCurrentAndPartialTmp,
                                         Start::kCurrentAndCompleteTmp),
                       ::testing::Values(CrashAt::kNowhere, CrashAt::kStaging,
                                         CrashAt::kOldDiscarded, CrashAt::kCurrentRetired,
                                         CrashAt::kNewInPlace)));

// Removing a directory takes its manifest first: a removal cut short never looks complete.
TEST(CheckpointRotationDiscard, RemovesTheManifestBeforeTheData) {
  ScratchDir scratch;
  const std::filesystem::path dir = scratch.path() / "ckpt";
  stage(dir, 3);
  ASSERT_TRUE(is_complete_checkpoint(dir));
  discard_checkpoint(dir);
  EXPECT_FALSE(std::filesystem::exists(dir));
  discard_checkpoint(dir);  // absent: nothing to do
}

}  // namespace
}  // namespace strata::runtime::detail
