// Proves checkpoints reshard (run under mpirun -np 2..4): a checkpoint saved by N ranks loads into
// 1 rank and one saved by 1 rank loads into N ranks with bitwise the same full master weights and
// moments (resharding moves bytes, never rounds), training continues within fp32 tolerance of an
// uninterrupted run, and N -> N save/load/continue is bitwise the uninterrupted N-rank run; with
// state on NVMe all of it streams within the host budget plus (ranks + 1) sub-groups of staging.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/plan/partition.hpp"
#include "tests/runtime/comm/mpi_test_main.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"

namespace strata::runtime {
namespace {

using comm::mpi_testing::world;
using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::TrainedModel;

// A directory every rank sees (named after rank 0's pid), removed at the end.
class SharedDir {
 public:
  SharedDir() {
    const std::uint64_t id = world().all_reduce_u64(
        world().rank() == 0 ? static_cast<std::uint64_t>(::getpid()) : 0, comm::ReduceOp::kMax);
    path_ = test_tmpdir_knob() / fmt::format("strata-ckpt-mpi-{}-{}", id, counter_++);
    if (world().rank() == 0) std::filesystem::create_directories(path_);
    world().barrier();
  }
  ~SharedDir() {
    world().barrier();
    std::error_code ignored;
    if (world().rank() == 0) std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

Config config_for(const ScratchDir& nvme, Tier optimizer = Tier::kHost) {
  Config config = engine_test_config(nvme.path().string());
  config.precision.params = DType::kFp32;  // gathers and reductions exact enough to compare
  config.precision.grads = DType::kFp32;
  config.zero.optimizer = optimizer;
  return config;
}

std::vector<std::vector<float>> full_masters(TrainedModel& run) {
  std::vector<std::vector<float>> out;
  for (UnitId unit : run.model->units()) out.push_back(run.engine->gather_master(unit));
  return out;
}

void expect_near(const std::vector<std::vector<float>>& got,
                 const std::vector<std::vector<float>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t u = 0; u < want.size(); ++u) {
    ASSERT_EQ(got[u].size(), want[u].size());
    for (std::size_t i = 0; i < want[u].size(); ++i) {
      // Only the order of the global-norm summation differs between rank counts.
      ASSERT_NEAR(got[u][i], want[u][i], 2e-6 + 2e-6 * std::fabs(want[u][i]))
          << what << ": unit " << u << " element " << i << " with " << world().size() << " ranks";
    }
  }
}

void expect_bitwise(const std::vector<std::vector<float>>& got,
                    const std::vector<std::vector<float>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t u = 0; u < want.size(); ++u) {
    ASSERT_EQ(got[u].size(), want[u].size());
    EXPECT_EQ(std::memcmp(got[u].data(), want[u].data(), want[u].size() * 4), 0)
        << what << ": unit " << u << " with " << world().size() << " ranks";
  }
}

TEST(CheckpointMpi, SavedByNRanksLoadsIntoOneRank) {
  SharedDir shared;
  ScratchDir nvme;
  std::vector<std::vector<float>> at_save;
  {
    TrainedModel sharded(config_for(nvme, Tier::kNvme), {}, testing::kEngineTestWidths, &world());
    sharded.train(2);
    sharded.engine->save(shared.path() / "ckpt");
    at_save = full_masters(sharded);
  }
  // Every rank loads the whole checkpoint alone (1 rank reads the files of all N).
  ScratchDir nvme_single;
  TrainedModel single(config_for(nvme_single));
  single.engine->load(shared.path() / "ckpt");
  EXPECT_EQ(single.engine->step_count(), 2u);
  expect_bitwise(full_masters(single), at_save, "N -> 1 right after load");
  single.train(2);
  ScratchDir nvme_reference;
  TrainedModel reference(config_for(nvme_reference));
  reference.train(4);
  expect_near(full_masters(single), full_masters(reference), "N -> 1, continued");
  world().barrier();
}

TEST(CheckpointMpi, SavedByOneRankLoadsIntoNRanks) {
  SharedDir shared;
  ScratchDir nvme;
  TrainedModel single(config_for(nvme));
  single.train(2);
  const std::vector<std::vector<float>> at_save = full_masters(single);
  if (world().rank() == 0) single.engine->save(shared.path() / "ckpt");
  world().barrier();
  ScratchDir nvme_sharded;
  TrainedModel sharded(config_for(nvme_sharded, Tier::kNvme), {}, testing::kEngineTestWidths,
                       &world());
  sharded.engine->load(shared.path() / "ckpt");
  EXPECT_EQ(sharded.engine->step_count(), 2u);
  expect_bitwise(full_masters(sharded), at_save, "1 -> N right after load");
  for (UnitId unit : sharded.model->units()) {
    // The moments were resharded too: each rank's exp_avg shard is its slice of the full one.
    const std::vector<float> mine = sharded.engine->state_shard(unit, OptimizerState::kExpAvg);
    const std::vector<float> whole = single.engine->state_shard(unit, OptimizerState::kExpAvg);
    const UnitLayout layout = make_unit_layout(sharded.engine->unit_spec(unit),
                                               static_cast<std::uint32_t>(world().size()));
    const auto rank = static_cast<std::uint32_t>(world().rank());
    const std::size_t begin = std::min(layout.numel, layout.shard_begin(rank));
    ASSERT_EQ(mine.size(), layout.shard_real_numel(rank));
    EXPECT_EQ(std::memcmp(mine.data(), whole.data() + begin, mine.size() * 4), 0)
        << "exp_avg of unit " << unit << " on rank " << rank;
  }
  sharded.train(2);
  single.train(2);
  expect_near(full_masters(sharded), full_masters(single), "1 -> N, continued");
}

TEST(CheckpointMpi, SameRankCountSaveLoadContinueIsBitwise) {
  SharedDir shared;
  ScratchDir nvme;
  TrainedModel straight(config_for(nvme), {}, testing::kEngineTestWidths, &world());
  straight.train(4);
  const std::vector<std::vector<float>> expected = full_masters(straight);
  ScratchDir nvme_first;
  {
    TrainedModel first(config_for(nvme_first, Tier::kNvme), {}, testing::kEngineTestWidths,
                       &world());
    first.train(2);
    first.engine->save(shared.path() / "ckpt");
  }
  ScratchDir nvme_second;
  TrainedModel second(config_for(nvme_second, Tier::kDevice), {}, testing::kEngineTestWidths,
                      &world());
  second.engine->load(shared.path() / "ckpt");
  second.train(2);
  expect_bitwise(full_masters(second), expected, "N -> N, continued");
}


// State homed on NVMe at over 4x the host budget: N ranks save and export, every rank then loads
// the checkpoint alone (N -> 1 resharding) and exports again, and N ranks import the export. The
// host pool's high-water mark never moves, staging stays within (ranks + 1) sub-groups, and the
// bytes are the same: masters bitwise, the 1-rank export bitwise the N-rank one.
TEST(CheckpointMpi, StreamedAcrossRankCountsWithinTheStagingBound) {
  const std::vector<std::uint32_t> widths = {512, 1024, 512, 8};  // 1.05 M parameters
  constexpr std::uint64_t kHostBudget = 3ull << 20;  // what one rank's NVMe staging needs
  const auto streamed_config = [&](const ScratchDir& nvme) {
    Config config = engine_test_config(nvme.path().string());  // bf16: exact bytes compared only
    config.zero.optimizer = Tier::kNvme;
    config.zero.params = Tier::kNvme;
    config.zero.grads = Tier::kNvme;
    config.tiers.host.budget_bytes = kHostBudget;
    config.tiers.nvme.fsync = false;  // durability is not what this test proves
    return config;
  };
  const auto staging_bound = [](std::uint32_t ranks) {
    return (ranks + 1) * sub_group_elements(2048) * sizeof(float);
  };
  const auto expect_within = [&](TrainedModel& run, std::uint64_t host_before,
                                 std::uint32_t ranks, const std::string& what) {
    EXPECT_EQ(run.engine->host_high_water_bytes(), host_before) << what;
    EXPECT_GT(run.engine->stream_staging_high_water_bytes(), 0u) << what;
    EXPECT_LE(run.engine->stream_staging_high_water_bytes(), staging_bound(ranks)) << what;
  };
  const auto bytes_of = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  const auto ranks = static_cast<std::uint32_t>(world().size());
  SharedDir shared;
  std::vector<std::vector<float>> at_save;
  {
    ScratchDir nvme;
    TrainedModel sharded(streamed_config(nvme), {}, widths, &world());
    std::uint64_t params = 0;
    for (UnitId u : sharded.model->units()) params += sharded.engine->unit_numel(u);
    ASSERT_GE(12 * params, 4 * kHostBudget);
    sharded.train(2);
    const std::uint64_t host_before = sharded.engine->host_high_water_bytes();
    sharded.engine->save(shared.path() / "ckpt");
    sharded.engine->export_safetensors(shared.path() / "sharded.safetensors");
    expect_within(sharded, host_before, ranks, "N-rank save and export");
    at_save = full_masters(sharded);
  }
  ScratchDir nvme_single;
  TrainedModel single(streamed_config(nvme_single), {}, widths);
  const std::uint64_t host_before = single.engine->host_high_water_bytes();
  single.engine->load(shared.path() / "ckpt");
  const auto single_export = nvme_single.path() / "single.safetensors";
  single.engine->export_safetensors(single_export);
  expect_within(single, host_before, 1, "N -> 1 load and export");
  EXPECT_EQ(single.engine->step_count(), 2u);
  expect_bitwise(full_masters(single), at_save, "N -> 1 streamed load");
  EXPECT_TRUE(bytes_of(single_export) == bytes_of(shared.path() / "sharded.safetensors"))
      << "the 1-rank export differs from the " << ranks << "-rank one";

  ScratchDir nvme_imported;
  TrainedModel imported(streamed_config(nvme_imported), {}, widths, &world());
  const std::uint64_t imported_before = imported.engine->host_high_water_bytes();
  imported.engine->import_safetensors(shared.path() / "sharded.safetensors");
  expect_within(imported, imported_before, 1, "N-rank import");  // no all-gather: one sub-group
  expect_bitwise(full_masters(imported), at_save, "N-rank streamed import");
  world().barrier();
}

}  // namespace
}  // namespace strata::runtime
