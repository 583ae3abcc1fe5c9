// Proves checkpoints reshard (run under mpirun -np 2..4): a checkpoint saved by N ranks loads into
// 1 rank and one saved by 1 rank loads into N ranks with bitwise the same full master weights and
// moments (resharding moves bytes, never rounds), training continues within fp32 tolerance of an
// uninterrupted run, and N -> N save/load/continue is bitwise the uninterrupted N-rank run.
#include <unistd.h>

#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/partition.hpp"
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

}  // namespace
}  // namespace strata::runtime
