// Proves [checkpoint] dir / interval_steps / keep do what docs/config.md says: a run saves
// "<dir>/step-N" every interval_steps and keeps exactly the newest `keep`, each loading to bitwise
// the state of its step; checkpoints past a run's first step are refused (or removed when told to
// overwrite); crash leftovers of older steps are cleaned; --resume-from's path resolves.
#include "runtime/checkpoint/periodic_checkpoints.hpp"

#include <fstream>
#include <map>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::expect_same_state;
using ::testing::HasSubstr;
using testing::TrainedModel;

CheckpointConfig every(std::uint64_t interval, std::uint32_t keep,
                       const std::filesystem::path& dir) {
  CheckpointConfig config;
  config.dir = dir.string();
  config.interval_steps = interval;
  config.keep = keep;
  return config;
}

std::set<std::string> entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Trains `steps` steps as the run loop does (training_run.hpp); returns the state after each.
std::map<std::uint64_t, std::vector<std::vector<float>>> run(TrainedModel& model,
                                                             const PeriodicCheckpoints& checkpoints,
                                                             int steps) {
  std::map<std::uint64_t, std::vector<std::vector<float>>> states;
  checkpoints.start(model.engine->step_count(), /*overwrite=*/false);
  for (int i = 0; i < steps; ++i) {
    model.train(1);
    checkpoints.after_step(*model.engine);
    states[model.engine->step_count()] = model.state();
  }
  return states;
}

TEST(PeriodicCheckpoints, KeepsTheNewestAndEachLoadsToItsStep) {
  ScratchDir nvme, out;
  const std::filesystem::path dir = out.path() / "ckpt";
  const Config config = engine_test_config(nvme.path().string());
  TrainedModel model(config);
  const auto states = run(model, PeriodicCheckpoints(every(2, 2, dir), true), 7);
  // Saved at steps 2, 4 and 6; step 2 removed once step 6 was complete.
  EXPECT_EQ(entries(dir), (std::set<std::string>{"step-000004", "step-000006"}));
  const std::vector<StepCheckpoint> listed = list_step_checkpoints(dir);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].step, 4u);
  EXPECT_EQ(listed[1].step, 6u);
  for (const StepCheckpoint& checkpoint : listed) {
    ScratchDir other_nvme;
    TrainedModel loaded(engine_test_config(other_nvme.path().string()));
    loaded.engine->load(checkpoint.path);
    EXPECT_EQ(loaded.engine->step_count(), checkpoint.step);
    expect_same_state(loaded.state(), states.at(checkpoint.step), checkpoint.path.string());
  }
}

TEST(PeriodicCheckpoints, IntervalZeroSavesNothing) {
  ScratchDir nvme, out;
  TrainedModel model(engine_test_config(nvme.path().string()));
  CheckpointConfig config;
  config.dir = (out.path() / "ckpt").string();
  run(model, PeriodicCheckpoints(config, true), 3);
  EXPECT_FALSE(std::filesystem::exists(out.path() / "ckpt"));
}

TEST(PeriodicCheckpoints, CheckpointsPastTheFirstStepAreRefusedOrRemovedOnRequest) {
  ScratchDir nvme, out;
  const std::filesystem::path dir = out.path() / "ckpt";
  {
    TrainedModel first(engine_test_config(nvme.path().string()));
    run(first, PeriodicCheckpoints(every(1, 3, dir), true), 3);
  }
  const PeriodicCheckpoints checkpoints(every(1, 3, dir), true);
  try {
    checkpoints.start(0, /*overwrite=*/false);
    FAIL() << "a fresh start over checkpoints 1..3 was not refused";
  } catch (const CheckpointsAhead& error) {
    EXPECT_THAT(error.what(), HasSubstr(dir.string()));
    EXPECT_THAT(error.what(), HasSubstr("step-000003"));
    EXPECT_THAT(error.what(), HasSubstr("--overwrite"));
  }
  EXPECT_EQ(entries(dir).size(), 3u);         // the refusal changed nothing
  checkpoints.start(3, /*overwrite=*/false);  // resumed at step 3: nothing ahead of it
  checkpoints.start(1, /*overwrite=*/true);   // steps 2 and 3 discarded, step 1 kept
  EXPECT_EQ(entries(dir), (std::set<std::string>{"step-000001"}));
}

TEST(PeriodicCheckpoints, CrashLeftoversOfOlderStepsAreRemoved) {
  ScratchDir nvme, out;
  const std::filesystem::path dir = out.path() / "ckpt";
  std::filesystem::create_directories(dir / "step-000001.tmp");  // a save that crashed midway
  std::ofstream(dir / "notes.txt") << "the user's own file stays";
  TrainedModel model(engine_test_config(nvme.path().string()));
  run(model, PeriodicCheckpoints(every(2, 1, dir), true), 2);
  EXPECT_EQ(entries(dir), (std::set<std::string>{"notes.txt", "step-000002"}));
}

TEST(PeriodicCheckpoints, ResumeFromResolvesACheckpointOrTheNewestInADirectory) {
  ScratchDir nvme, out;
  const std::filesystem::path dir = out.path() / "ckpt";
  EXPECT_FALSE(resolve_checkpoint(dir).has_value());
  TrainedModel model(engine_test_config(nvme.path().string()));
  run(model, PeriodicCheckpoints(every(1, 2, dir), true), 3);
  EXPECT_EQ(resolve_checkpoint(dir).value_or("none").string(),
            step_checkpoint_path(dir, 3).string());
  EXPECT_EQ(resolve_checkpoint(dir / "step-000002").value_or("none").string(),
            (dir / "step-000002").string());
  EXPECT_FALSE(resolve_checkpoint(dir / "step-000001").has_value());  // removed (keep 2)
  EXPECT_EQ(step_checkpoint_path(dir, 1234567).string(), (dir / "step-1234567").string());
}

}  // namespace
}  // namespace strata::runtime
