// Proves a power loss at any instant never loses or tears committed training state: training
// (store on NVMe) and checkpoint saves with rotation are recorded by io::PowerLossSimulator, then
// hundreds of seeded crash images (un-fsynced writes dropped or torn, un-synced directory entries
// undone) are reopened: each lands on a committed step with bitwise that step's state, and
// training continued from there ends bitwise where the uninterrupted run ended.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "io/power_loss_simulator.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::expect_same_state;
using testing::TrainedModel;

constexpr int kSteps = 3;
constexpr int kStoreTrials = 100;       // ~50 ms each: an Engine over the NVMe store
constexpr int kCheckpointTrials = 150;  // ~10 ms each

// At least 100 trials per test in the normal pass; fewer under the sanitizers (each trial builds
// an Engine), and STRATA_POWER_LOSS_TRIALS overrides both.
int trial_count(int normal) {
  if (const char* text = std::getenv("STRATA_POWER_LOSS_TRIALS")) return std::atoi(text);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return normal / 6;
#else
  return normal;
#endif
}

Config store_config(const std::filesystem::path& nvme) {
  Config config = engine_test_config(nvme.string());
  config.zero.params = Tier::kNvme;
  config.zero.grads = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  config.zero.buffer_count = 3;
  // A restart after the crash resumes whatever the store committed (and starts afresh when it
  // holds nothing past step 0), as `strata-finetune --resume` would.
  config.tiers.nvme.on_existing = OnExistingStore::kResume;
  return config;
}

// One recorded run: the simulator's log, the operation count at which each step was committed
// (or saved), and the state after each step (the uninterrupted reference).
struct RecordedRun {
  std::unique_ptr<io::PowerLossSimulator> simulator;
  std::vector<std::uint64_t> durable_after;  // [s]: operations once step s's commit/save returned
  std::vector<std::vector<std::vector<float>>> reference;  // [s]: state after s steps
};

// The committed step a crash after `operations` must at least keep, and the newest it may show
// (the commit in flight, whose manifest or rename may have reached the disk).
struct StepBounds {
  std::optional<std::uint64_t> at_least;
  std::uint64_t at_most = 0;
};

StepBounds bounds_at(const RecordedRun& run, std::uint64_t operations) {
  StepBounds bounds;
  for (std::uint64_t s = 0; s < run.durable_after.size(); ++s) {
    if (run.durable_after[s] <= operations) {
      bounds.at_least = s;
    } else {
      bounds.at_most = s;
      return bounds;
    }
  }
  bounds.at_most = run.durable_after.size() - 1;
  return bounds;
}

struct TrialTally {
  int trials = 0;
  int resumed_mid_run = 0;  // landed on a step in (0, kSteps)
  int fell_back = 0;        // landed on an older step than the one in flight
  io::CrashReport losses;   // summed
  void add(const io::CrashReport& report) {
    losses.writes_pending += report.writes_pending;
    losses.writes_dropped += report.writes_dropped;
    losses.writes_torn += report.writes_torn;
    losses.entries_pending += report.entries_pending;
    losses.entries_undone += report.entries_undone;
  }
  void print(const char* what, std::chrono::steady_clock::duration took) const {
    std::printf(
        "power loss (%s): %d trials in %.0f ms; %d resumed mid-run, %d on an older step than "
        "the one in flight; writes pending %llu, dropped %llu, torn %llu; entries pending %llu, "
        "undone %llu\n",
        what, trials, std::chrono::duration<double, std::milli>(took).count(), resumed_mid_run,
        fell_back, static_cast<unsigned long long>(losses.writes_pending),
        static_cast<unsigned long long>(losses.writes_dropped),
        static_cast<unsigned long long>(losses.writes_torn),
        static_cast<unsigned long long>(losses.entries_pending),
        static_cast<unsigned long long>(losses.entries_undone));
  }
};

std::string describe_crash(const RecordedRun& run, std::uint64_t crash_at, std::uint64_t seed) {
  const std::vector<io::FileOp> log = run.simulator->log();
  return fmt::format("seed {}, crash after operation {} of {} ({})", seed, crash_at, log.size(),
                     crash_at == 0 ? std::string("none yet") : io::describe(log[crash_at - 1]));
}

// The crash point and seed of trial `trial`: seeded, so a failure names what reproduces it.
std::uint64_t crash_point(const RecordedRun& run, int trial) {
  std::mt19937_64 random(static_cast<std::uint64_t>(trial) * 7919 + 1);
  return std::uniform_int_distribution<std::uint64_t>(0, run.simulator->operations())(random);
}

TEST(PowerLoss, TheNvmeStoreReopensAtTheLastDurableCommitAndTrainsOnBitwise) {
  ScratchDir nvme;
  ScratchDir images;
  RecordedRun run;
  run.simulator = std::make_unique<io::PowerLossSimulator>(nvme.path());
  {
    TrainedModel model(store_config(nvme.path()));  // finalize commits step 0
    run.durable_after.push_back(run.simulator->operations());
    run.reference.push_back(model.state());
    for (int s = 1; s <= kSteps; ++s) {
      model.train(1);
      run.durable_after.push_back(run.simulator->operations());
      run.reference.push_back(model.state());
    }
  }
  run.simulator->stop();
  const auto started = std::chrono::steady_clock::now();
  TrialTally tally;
  for (int trial = 0; trial < trial_count(kStoreTrials); ++trial) {
    const std::uint64_t crash_at = crash_point(run, trial);
    const auto seed = static_cast<std::uint64_t>(trial);
    const std::filesystem::path image = images.path() / fmt::format("trial-{}", trial);
    tally.add(run.simulator->write_crash_image(crash_at, seed, image));
    const std::string what = describe_crash(run, crash_at, seed);
    const StepBounds bounds = bounds_at(run, crash_at);
    Config restart = store_config(image);
    // The restarted run's own durability is not on trial here: through the page cache, unsynced.
    restart.tiers.nvme.fsync = false;
    restart.tiers.nvme.direct = false;
    std::uint64_t at = 0;
    try {
      TrainedModel restarted(restart);
      at = restarted.engine->step_count();
      ASSERT_GE(at, bounds.at_least.value_or(0)) << what << ": a durable commit was lost";
      ASSERT_LE(at, bounds.at_most) << what;
      expect_same_state(restarted.state(), run.reference[at], what + ", state at the resumed step");
      restarted.train(kSteps - static_cast<int>(at));
      expect_same_state(restarted.state(), run.reference[kSteps], what + ", continued to the end");
    } catch (const std::exception& error) {
      FAIL() << what << ": " << error.what();
    }
    if (::testing::Test::HasFailure()) return;
    ++tally.trials;
    tally.resumed_mid_run += at > 0 && at < kSteps ? 1 : 0;
    tally.fell_back += at < bounds.at_most ? 1 : 0;
    std::filesystem::remove_all(image);
  }
  tally.print("NVMe store", std::chrono::steady_clock::now() - started);
  if (trial_count(kStoreTrials) >= 100) {
    EXPECT_GT(tally.resumed_mid_run, 0);
    EXPECT_GT(tally.losses.writes_dropped, 0u);
    EXPECT_GT(tally.losses.writes_torn, 0u);
    EXPECT_GT(tally.losses.entries_undone, 0u);
  }
}

TEST(PowerLoss, ACheckpointDirectoryLoadsTheNewestCompleteSaveAndTrainsOnBitwise) {
  ScratchDir nvme;
  ScratchDir checkpoints;
  ScratchDir images;
  RecordedRun run;
  run.simulator = std::make_unique<io::PowerLossSimulator>(checkpoints.path());
  {
    TrainedModel model(engine_test_config(nvme.path().string()));
    run.reference.push_back(model.state());
    run.durable_after.push_back(0);  // step 0 is never saved: see the bounds below
    for (int s = 1; s <= kSteps; ++s) {
      model.train(1);
      model.engine->save(checkpoints / "ckpt");  // the second and third rotate
      run.durable_after.push_back(run.simulator->operations());
      run.reference.push_back(model.state());
    }
  }
  run.simulator->stop();
  const auto started = std::chrono::steady_clock::now();
  TrialTally tally;
  for (int trial = 0; trial < trial_count(kCheckpointTrials); ++trial) {
    const std::uint64_t crash_at = crash_point(run, trial);
    const auto seed = static_cast<std::uint64_t>(trial);
    const std::filesystem::path image = images.path() / fmt::format("trial-{}", trial);
    tally.add(run.simulator->write_crash_image(crash_at, seed, image));
    const std::string what = describe_crash(run, crash_at, seed);
    StepBounds bounds = bounds_at(run, crash_at);
    if (bounds.at_least == 0u) bounds.at_least.reset();  // no save has returned yet
    ScratchDir fresh_nvme;
    TrainedModel restarted(engine_test_config(fresh_nvme.path().string()));
    try {
      restarted.engine->load(image / "ckpt");
    } catch (const std::exception& error) {
      // Only before the first save returned may there be nothing complete to load.
      ASSERT_FALSE(bounds.at_least.has_value()) << what << ": " << error.what();
      ++tally.trials;
      std::filesystem::remove_all(image);
      continue;
    }
    const std::uint64_t at = restarted.engine->step_count();
    ASSERT_GE(at, bounds.at_least.value_or(1)) << what << ": a complete checkpoint was lost";
    ASSERT_LE(at, bounds.at_most) << what;
    expect_same_state(restarted.state(), run.reference[at], what + ", state loaded");
    try {
      restarted.train(kSteps - static_cast<int>(at));
    } catch (const std::exception& error) {
      FAIL() << what << ": training on after the load: " << error.what();
    }
    expect_same_state(restarted.state(), run.reference[kSteps], what + ", continued to the end");
    if (::testing::Test::HasFailure()) return;
    ++tally.trials;
    tally.resumed_mid_run += at < kSteps ? 1 : 0;
    tally.fell_back += at < bounds.at_most ? 1 : 0;
    std::filesystem::remove_all(image);
  }
  tally.print("checkpoint directory", std::chrono::steady_clock::now() - started);
  if (trial_count(kCheckpointTrials) >= 100) {
    EXPECT_GT(tally.resumed_mid_run, 0);
    EXPECT_GT(tally.losses.entries_undone, 0u);
    EXPECT_GT(tally.losses.writes_dropped, 0u);
  }
}

}  // namespace
}  // namespace strata::runtime
