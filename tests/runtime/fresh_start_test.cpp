// Proves that starting afresh over an NVMe store holding a committed step is refused by default
// (naming the store, the model and the step) with every byte on disk unchanged, and that the two
// ways out work: overwrite starts at step 0 exactly like a new store, resume continues the run.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/whole_file.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using ::testing::HasSubstr;
using testing::host_device;
using testing::kEngineTestWidths;
using testing::TinyMlp;

Config nvme_config(const ScratchDir& dir) {
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.params = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  return config;
}

struct Outcome {
  std::uint64_t first_step = 0;  // where finalize left the run
  std::vector<std::vector<float>> masters;
};

// Opens an Engine over `config`'s store, trains until step `last_step`, returns the masters.
Outcome run_until(const Config& config, std::uint64_t last_step, EngineOptions options = {}) {
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm, options);
  TinyMlp model(kEngineTestWidths, 16, /*data_seed=*/7);
  model.add_units(engine);
  engine.finalize();
  Outcome outcome;
  outcome.first_step = engine.step_count();
  while (engine.step_count() < last_step) {
    model.train_step(engine);
    engine.step();
  }
  for (UnitId unit : model.units()) outcome.masters.push_back(engine.master_shard(unit));
  return outcome;
}

// Every file in the store directory but the lock, with its bytes.
std::map<std::string, std::vector<std::uint8_t>> store_files(const ScratchDir& dir) {
  std::map<std::string, std::vector<std::uint8_t>> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".lock")) continue;
    files[name] = io::read_file_bytes(entry.path());
  }
  return files;
}

TEST(FreshStart, OverACommittedStoreIsRefusedWithNothingOnDiskChanged) {
  ScratchDir dir;
  const Config config = nvme_config(dir);
  run_until(config, 2);
  const auto before = store_files(dir);
  ASSERT_TRUE(before.contains("strata-rank0.manifest.0"));
  ASSERT_TRUE(before.contains("strata-rank0.swap"));
  ASSERT_TRUE(before.contains("strata-rank0.model.json"));
  try {
    run_until(config, 4);
    FAIL() << "a fresh start over a store committed at step 2 was not refused";
  } catch (const CommittedStoreExists& error) {
    EXPECT_EQ(error.step(), 2u);
    const std::string message = error.what();
    EXPECT_THAT(message, HasSubstr(dir.path().string()));
    EXPECT_THAT(message, HasSubstr("committed at step 2"));
    EXPECT_THAT(message, HasSubstr("3 units"));  // the model, from strata-rank0.model.json
    EXPECT_THAT(message, HasSubstr("--resume"));
    EXPECT_THAT(message, HasSubstr("--overwrite"));
  }
  const auto after = store_files(dir);
  ASSERT_EQ(after.size(), before.size()) << "the refused start created or removed files";
  for (const auto& [name, bytes] : before) {
    EXPECT_TRUE(after.at(name) == bytes) << "the refused start changed " << name;
  }
}

TEST(FreshStart, OverwriteStartsAtStepZeroLikeANewStore) {
  ScratchDir fresh_dir;
  const Outcome fresh = run_until(nvme_config(fresh_dir), 3);
  ScratchDir dir;
  Config config = nvme_config(dir);
  run_until(config, 2);
  const Outcome by_option = run_until(config, 3, EngineOptions{.overwrite = true});
  EXPECT_EQ(by_option.first_step, 0u);
  EXPECT_EQ(by_option.masters, fresh.masters);
  config.tiers.nvme.on_existing = OnExistingStore::kOverwrite;
  const Outcome by_config = run_until(config, 3);
  EXPECT_EQ(by_config.first_step, 0u);
  EXPECT_EQ(by_config.masters, fresh.masters);
}

TEST(FreshStart, ConfigResumeContinuesTheCommittedRun) {
  ScratchDir straight_dir;
  const Outcome straight = run_until(nvme_config(straight_dir), 4);
  ScratchDir dir;
  Config config = nvme_config(dir);
  run_until(config, 2);
  config.tiers.nvme.on_existing = OnExistingStore::kResume;
  const Outcome resumed = run_until(config, 4);
  EXPECT_EQ(resumed.first_step, 2u);
  EXPECT_EQ(resumed.masters, straight.masters);
  // With nothing committed yet, on_existing = "resume" starts afresh.
  ScratchDir empty_dir;
  Config empty_config = nvme_config(empty_dir);
  empty_config.tiers.nvme.on_existing = OnExistingStore::kResume;
  EXPECT_EQ(run_until(empty_config, 1).first_step, 0u);
}

TEST(FreshStart, StoreCommittedOnlyAtStepZeroIsStartedOverWithoutAsking) {
  ScratchDir dir;
  const Config config = nvme_config(dir);
  run_until(config, 0);  // finalize commits the initial state as step 0
  EXPECT_EQ(run_until(config, 1).first_step, 0u);
}

TEST(FreshStart, ResumeAndOverwriteTogetherAreRefused) {
  ScratchDir dir;
  const Config config = nvme_config(dir);
  EXPECT_THROW(run_until(config, 1, EngineOptions{.resume = true, .overwrite = true}),
               std::invalid_argument);
}

}  // namespace
}  // namespace strata::runtime
