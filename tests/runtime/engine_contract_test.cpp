// Proves that step() checks its contracts and names the unit that breaks one: no GatheredUnit
// alive, and every unit given exactly grad_accumulation reduce_grads calls since the last step.
// A refused step changes nothing: once the caller complies, the step runs as if never refused.
// Unknown unit ids are refused by name.
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using ::testing::HasSubstr;

struct Fixture {
  explicit Fixture(std::uint32_t grad_accumulation = 1)
      : config(testing::engine_test_config(dir.path().string())),
        device(testing::host_device(config)),
        engine(config, *device, comm, EngineOptions{.grad_accumulation = grad_accumulation}),
        model(testing::kEngineTestWidths, 16, 7) {
    model.add_units(engine);
    engine.finalize();
  }
  // A zero gradient for `unit` (the contracts count calls, not values).
  void reduce_zero(UnitId unit) {
    const std::vector<float> grads(engine.unit_numel(unit), 0.0f);
    engine.reduce_grads(unit, grads);
  }
  std::string step_error() {
    try {
      engine.step();
    } catch (const std::logic_error& error) {
      return error.what();
    }
    ADD_FAILURE() << "step() accepted a broken contract";
    return {};
  }
  ScratchDir dir;
  Config config;
  std::unique_ptr<tiers::Device> device;
  comm::LocalComm comm;
  Engine engine;
  testing::TinyMlp model;
};

TEST(EngineContract, StepWithALiveGatheredUnitNamesTheUnit) {
  Fixture fixture;
  fixture.model.train_step(fixture.engine);
  std::optional<GatheredUnit> held = fixture.engine.gather(fixture.model.units()[1]);
  const std::string error = fixture.step_error();
  EXPECT_THAT(error, HasSubstr("unit 'layer1' is gathered"));
  EXPECT_THAT(error, HasSubstr("destroy every GatheredUnit before step()"));
  held.reset();
  EXPECT_EQ(fixture.engine.step().step, 1u);
}

TEST(EngineContract, StepWithoutAUnitsGradientNamesTheUnit) {
  Fixture fixture;
  const std::vector<UnitId>& units = fixture.model.units();
  fixture.reduce_zero(units[0]);
  fixture.reduce_zero(units[2]);
  const std::string error = fixture.step_error();
  EXPECT_THAT(error, HasSubstr("unit 'layer1' got 0 reduce_grads call(s) since the last step"));
  EXPECT_THAT(error, HasSubstr("it needs 1"));
  EXPECT_EQ(fixture.engine.step_count(), 0u);
  fixture.reduce_zero(units[1]);
  EXPECT_EQ(fixture.engine.step().step, 1u);
}

TEST(EngineContract, StepWithAPartiallyAccumulatedGradientNamesTheUnit) {
  Fixture fixture(/*grad_accumulation=*/2);
  const std::vector<UnitId>& units = fixture.model.units();
  for (UnitId unit : units) fixture.reduce_zero(unit);
  fixture.reduce_zero(units[0]);
  fixture.reduce_zero(units[1]);
  const std::string error = fixture.step_error();
  EXPECT_THAT(error, HasSubstr("unit 'layer2' got 1 reduce_grads call(s)"));
  EXPECT_THAT(error, HasSubstr("it needs 2 (EngineOptions::grad_accumulation)"));
  fixture.reduce_zero(units[2]);
  EXPECT_EQ(fixture.engine.step().step, 1u);
}

// A refused step leaves the state as it was: the same training with and without a refusal in the
// middle gives bitwise the same weights.
TEST(EngineContract, ARefusedStepChangesNothing) {
  const auto train = [](bool refuse) {
    Fixture fixture;
    for (int step = 0; step < 3; ++step) {
      fixture.model.train_step(fixture.engine);
      if (refuse && step == 1) {
        std::optional<GatheredUnit> held = fixture.engine.gather(fixture.model.units()[0]);
        EXPECT_THROW(fixture.engine.step(), std::logic_error);
      }
      fixture.engine.step();
    }
    std::vector<std::vector<float>> masters;
    for (UnitId unit : fixture.model.units()) {
      masters.push_back(fixture.engine.master_shard(unit));
    }
    return masters;
  };
  const auto straight = train(false);
  const auto refused = train(true);
  ASSERT_EQ(straight.size(), refused.size());
  for (std::size_t u = 0; u < straight.size(); ++u) {
    ASSERT_EQ(straight[u].size(), refused[u].size());
    EXPECT_EQ(std::memcmp(straight[u].data(), refused[u].data(), straight[u].size() * 4), 0)
        << "unit " << u;
  }
}

// gather and reduce_grads refuse an unknown unit id as every other call does, naming it.
TEST(EngineContract, GatherAndReduceGradsOfAnUnknownUnitNameTheId) {
  Fixture fixture;
  const auto refusal = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::out_of_range& error) {
      return error.what();
    }
    return "accepted";
  };
  const std::string unknown = "unit id 99 is unknown (the Engine has 3 units)";
  EXPECT_EQ(refusal([&] { fixture.engine.gather(99); }), unknown);
  EXPECT_EQ(refusal([&] { fixture.engine.reduce_grads(99, std::vector<float>(16, 0.0f)); }),
            unknown);
  fixture.model.train_step(fixture.engine);  // nothing was left half done
  EXPECT_EQ(fixture.engine.step().step, 1u);
}

TEST(EngineContract, StateShardOfAMomentTheOptimizerDoesNotKeepIsAnError) {
  ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.optimizer.type = OptimizerType::kLion;
  auto device = testing::host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm);
  testing::TinyMlp model(testing::kEngineTestWidths, 16, 7);
  model.add_units(engine);
  engine.finalize();
  EXPECT_EQ(engine.state_shard(model.units()[0], OptimizerState::kExpAvg).size(), 1800u);
  try {
    engine.state_shard(model.units()[0], OptimizerState::kExpAvgSq);
    FAIL() << "Lion has no exp_avg_sq";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("the lion optimizer keeps no 'exp_avg_sq'"));
  }
}

}  // namespace
}  // namespace strata::runtime
