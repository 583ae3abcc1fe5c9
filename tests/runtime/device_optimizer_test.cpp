// Proves the Engine's device optimizer: on the staged data path (CUDA's, run here on HostDevice's
// streams) with the master, moments, gradients and parameters all homed on the device, every
// sub-group is updated in place by the device's optimizer op (StepStats::device_updated_groups,
// nothing staged through host memory), and the state and parameters are bitwise the direct path's
// CPU optimizer, for every algorithm and state format, with tensors that opt out of weight decay
// inside a sub-group, 16-bit and fp32 parameters; with a kind off the device it stages as before.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime {
namespace {

using Access = EngineOptions::DeviceAccess;
using cpu_adam::StateDType;
using io::testing::ScratchDir;

constexpr int kSteps = 3;

// Two units whose 2048-element sub-groups hold decayed and undecayed tensors side by side.
std::vector<UnitSpec> units() {
  UnitSpec mixed;
  mixed.name = "mixed";
  mixed.tensors.push_back({"a.w", {50, 50}, TensorInit::normal(1.0f), true});
  mixed.tensors.push_back({"a.b", {50}, TensorInit::zeros(), false});
  mixed.tensors.push_back({"ln.g", {50}, TensorInit::ones(), false});
  mixed.tensors.push_back({"c.w", {30, 60}, TensorInit::normal(1.0f), true});
  mixed.tensors.push_back({"c.b", {60}, TensorInit::zeros(), false});
  UnitSpec head;
  head.name = "head";
  head.tensors.push_back({"w", {40, 25}, TensorInit::normal(0.5f), true});
  head.tensors.push_back({"b", {25}, TensorInit::zeros(), false});
  return {mixed, head};
}

struct Format {
  StateDType master;
  StateDType moments;
  MasterRounding rounding;
  const char* name;
};
constexpr Format kFormats[] = {
    {StateDType::kFp32, StateDType::kFp32, MasterRounding::kStochastic, "fp32"},
    {StateDType::kFp32, StateDType::kBf16, MasterRounding::kStochastic, "bf16_moments"},
    {StateDType::kBf16, StateDType::kInt8, MasterRounding::kStochastic, "bf16_master_int8"},
    {StateDType::kBf16, StateDType::kBf16, MasterRounding::kKahan, "kahan_bf16_moments"},
};

Config device_config(const ScratchDir& dir, OptimizerType type, const Format& format,
                     DType params) {
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kDevice;
  config.optimizer.type = type;
  config.optimizer.weight_decay = 0.1;
  if (type == OptimizerType::kLion) config.optimizer.lr = 1e-3;
  config.optimizer.master_dtype = format.master;
  config.optimizer.state_dtype = format.moments;
  config.optimizer.master_rounding = format.rounding;
  config.precision.params = params;
  return config;
}

// What a run leaves: every unit's master and moments in fp32, its gathered parameters, and the
// sub-groups each step updated on the device.
struct Result {
  std::vector<std::vector<float>> state;
  std::vector<std::vector<float>> params;
  std::vector<std::uint64_t> device_updated_groups;
};

Result train(const Config& config, Access access) {
  tiers::DeviceOptions device_options;
  device_options.kind = tiers::DeviceKind::kHost;
  device_options.budget_bytes = config.tiers.device.budget_bytes;
  auto device = tiers::make_device(device_options);
  comm::LocalComm comm;
  Engine engine(config, *device, comm, EngineOptions{.device_access = access});
  std::vector<UnitId> ids;
  for (const UnitSpec& unit : units()) ids.push_back(engine.add_unit(unit));
  engine.finalize();
  Result result;
  std::mt19937_64 random(20261204);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int step = 0; step < kSteps; ++step) {
    for (UnitId id : ids) {
      std::vector<float> grads(engine.unit_numel(id));
      for (float& g : grads) g = normal(random);
      engine.reduce_grads(id, grads);  // host memory is the host device's memory
    }
    const StepStats stats = engine.step();
    EXPECT_FALSE(stats.skipped);
    result.device_updated_groups.push_back(stats.device_updated_groups);
  }
  for (UnitId id : ids) {
    for (OptimizerState kind :
         {OptimizerState::kMaster, OptimizerState::kExpAvg, OptimizerState::kExpAvgSq}) {
      try {
        result.state.push_back(engine.state_shard(id, kind));
      } catch (const std::invalid_argument&) {  // an optimizer without this moment
        result.state.emplace_back();
      }
    }
    const GatheredUnit gathered = engine.gather(id);
    std::vector<float> values;
    for (std::size_t t = 0; t < gathered.tensor_count(); ++t) {
      const std::span<const float> tensor = gathered.tensor(t);
      values.insert(values.end(), tensor.begin(), tensor.end());
    }
    result.params.push_back(std::move(values));
  }
  return result;
}

void expect_same(const std::vector<std::vector<float>>& got,
                 const std::vector<std::vector<float>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << what << " " << i;
    if (got[i].empty()) continue;  // a moment the optimizer does not keep
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)), 0)
        << what << " " << i << " differs from the direct path's CPU optimizer";
  }
}

using Param = std::tuple<OptimizerType, int, DType>;

class EngineDeviceOptimizer : public ::testing::TestWithParam<Param> {};

TEST_P(EngineDeviceOptimizer, UpdatesInPlaceBitwiseAsTheCpuOptimizer) {
  const auto [type, format_index, params] = GetParam();
  const Format& format = kFormats[format_index];
  ScratchDir direct_dir, staged_dir;
  const Result direct = train(device_config(direct_dir, type, format, params), Access::kAuto);
  const Result staged = train(device_config(staged_dir, type, format, params), Access::kStaged);
  expect_same(staged.state, direct.state, "master / moments");
  expect_same(staged.params, direct.params, "gathered parameters");
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(direct.device_updated_groups[step], 0u) << "the direct path runs cpu_adam";
    // mixed: 4460 elements, three sub-groups; head: 1025 elements, one.
    EXPECT_EQ(staged.device_updated_groups[step], 4u) << "step " << step + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AlgorithmsFormats, EngineDeviceOptimizer,
    ::testing::Combine(::testing::Values(OptimizerType::kAdamW, OptimizerType::kAdam,
                                         OptimizerType::kAdagrad, OptimizerType::kLion),
                       ::testing::Range(0, static_cast<int>(std::size(kFormats))),
                       ::testing::Values(DType::kBf16, DType::kFp32)),
    [](const auto& param_info) {
      return fmt::format("{}_{}_params_{}", to_string(std::get<0>(param_info.param)),
                         kFormats[std::get<1>(param_info.param)].name,
                         dtype_name(std::get<2>(param_info.param)));
    });

// A kind homed off the device: the sub-groups go through the host staging and cpu_adam, as before.
TEST(EngineDeviceOptimizerFallback, StagesWhenTheGradientsAreInHostMemory) {
  ScratchDir dir;
  Config config = device_config(dir, OptimizerType::kAdamW, kFormats[0], DType::kBf16);
  config.zero.grads = Tier::kHost;
  const Result staged = train(config, Access::kStaged);
  for (std::uint64_t groups : staged.device_updated_groups) EXPECT_EQ(groups, 0u);
  ScratchDir direct_dir;
  const Result direct = train(config, Access::kAuto);
  expect_same(staged.state, direct.state, "master / moments");
}

}  // namespace
}  // namespace strata::runtime
