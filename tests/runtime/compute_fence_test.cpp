// Engine::set_compute_fence: with a model whose unit calls return before their compute is done,
// the Engine takes a ticket at each release and waits on it before the unit's buffers go. The
// fence here stands in for such a model: the test checks, at each wait, that the unit released
// with that ticket still holds its parameters (the device poisons what it releases, so a buffer
// freed before the wait reads 0xFF), and that the fence changes no bit of training.
#include "tiers/device/compute_fence.hpp"

#include <cstring>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::kEngineTestWidths;
using testing::TinyMlp;
using Access = EngineOptions::DeviceAccess;

// Each ticket's unit: where its parameters were and what they held when it was released.
struct Released {
  const float* data = nullptr;
  std::vector<float> values;
};

class CheckingFence final : public tiers::ComputeFence {
 public:
  std::uint64_t mark() override { return ++marks_; }
  void wait(std::uint64_t ticket) override {
    ++waits_;
    EXPECT_LE(ticket, marks_) << "a wait for a ticket never handed out";
    const auto found = released_.find(ticket);
    if (found == released_.end()) return;  // a release the test did not record (the MLP's)
    ++checked_;
    const Released& unit = found->second;
    EXPECT_EQ(std::memcmp(unit.data, unit.values.data(), unit.values.size() * sizeof(float)), 0)
        << "ticket " << ticket << ": the unit's buffers changed before the wait for its compute";
  }
  // The next release's ticket is marks() + 1.
  std::uint64_t marks() const { return marks_; }
  void expect_release(std::uint64_t ticket, Released unit) { released_[ticket] = std::move(unit); }
  std::uint64_t waits() const { return waits_; }
  std::uint64_t checked() const { return checked_; }

 private:
  std::uint64_t marks_ = 0, waits_ = 0, checked_ = 0;
  std::map<std::uint64_t, Released> released_;
};

std::unique_ptr<tiers::Device> poisoning_device(const Config& config) {
  tiers::DeviceOptions options;
  options.kind = tiers::DeviceKind::kHost;
  options.budget_bytes = config.tiers.device.budget_bytes;
  options.poison = tiers::PoisonOnRelease::kOn;
  return tiers::make_device(options);
}

struct FenceRun {
  std::vector<std::vector<float>> masters;
  std::uint64_t waits = 0, checked = 0, marks = 0;
};

// Three steps of the MLP with every unit gathered and evicted each step (no persistent units),
// then each unit gathered and released once more by the test itself with its parameters
// recorded, and a step that evicts them all.
FenceRun run(Access access, bool with_fence) {
  ScratchDir dir;
  Config config = engine_test_config(dir.path().string());
  config.zero.persistence_threshold = 0;
  config.tiers.device.budget_bytes = 1ull << 20;
  auto device = poisoning_device(config);
  comm::LocalComm comm;
  EngineOptions options;
  options.device_access = access;
  Engine engine(config, *device, comm, options);
  CheckingFence fence;
  if (with_fence) engine.set_compute_fence(&fence);
  TinyMlp model(kEngineTestWidths, 16, 7);
  model.add_units(engine);
  engine.finalize();
  for (int step = 0; step < 3; ++step) {
    model.train_step(engine);
    engine.step();
  }
  model.train_step(engine);  // gradients for the step below; then the test's own gathers
  for (const UnitId id : model.units()) {
    GatheredUnit unit = engine.gather(id);
    const float* data = unit.tensor(0).data();
    std::size_t count = 0;
    for (std::size_t t = 0; t < unit.tensor_count(); ++t) count += unit.tensor(t).size();
    fence.expect_release(fence.marks() + 1, {data, std::vector<float>(data, data + count)});
  }
  engine.step();
  FenceRun result;
  for (const UnitId id : model.units()) result.masters.push_back(engine.master_shard(id));
  result.waits = fence.waits();
  result.checked = fence.checked();
  result.marks = fence.marks();
  return result;
}

class ComputeFence : public ::testing::TestWithParam<Access> {};

TEST_P(ComputeFence, IsWaitedForBeforeAReleasedUnitsBuffersGoAndChangesNoBit) {
  const FenceRun fenced = run(GetParam(), true);
  const FenceRun plain = run(GetParam(), false);
  // One ticket per release; the evictions (within the passes, at every step) waited on theirs,
  // the test's own units' among them, each with its parameters still in place.
  EXPECT_GT(fenced.marks, 0u);
  EXPECT_GT(fenced.waits, 0u);
  EXPECT_EQ(fenced.checked, kEngineTestWidths.size() - 1) << "a released unit evicted unwaited";
  EXPECT_EQ(plain.waits, 0u);
  ASSERT_EQ(fenced.masters.size(), plain.masters.size());
  for (std::size_t u = 0; u < plain.masters.size(); ++u) {
    ASSERT_EQ(fenced.masters[u].size(), plain.masters[u].size());
    EXPECT_EQ(std::memcmp(fenced.masters[u].data(), plain.masters[u].data(),
                          plain.masters[u].size() * sizeof(float)),
              0)
        << "unit " << u << " differs with the fence";
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, ComputeFence, ::testing::Values(Access::kAuto, Access::kStaged),
                         [](const ::testing::TestParamInfo<Access>& param_info) {
                           return param_info.param == Access::kStaged ? "staged" : "direct";
                         });

}  // namespace
}  // namespace strata::runtime
