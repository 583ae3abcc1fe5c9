// Shared by the checkpoint, fault and crash tests: an Engine over TinyMlp on the host device, and
// bitwise comparison of what two runs end with.
#pragma once

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime::testing {

// One Engine with its device and communicator, TinyMlp registered and finalized.
struct TrainedModel {
  std::unique_ptr<tiers::Device> device;
  comm::LocalComm local;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<TinyMlp> model;
  std::vector<float> losses;

  TrainedModel(const Config& config, const EngineOptions& options = {},
               const std::vector<std::uint32_t>& widths = kEngineTestWidths,
               comm::Communicator* comm = nullptr) {
    device = host_device(config);
    engine = std::make_unique<Engine>(config, *device, comm != nullptr ? *comm : local, options);
    model = std::make_unique<TinyMlp>(widths, 16, /*data_seed=*/7);
    model->add_units(*engine);
    engine->finalize();
  }
  StepStats train(int steps) {
    StepStats stats;
    for (int i = 0; i < steps; ++i) {
      losses.push_back(model->train_step(*engine, engine->loss_scale()));
      stats = engine->step();
    }
    return stats;
  }
  // Every unit's master, exp_avg and exp_avg_sq shard, concatenated.
  std::vector<std::vector<float>> state() {
    std::vector<std::vector<float>> out;
    for (UnitId unit : model->units()) {
      for (OptimizerState kind :
           {OptimizerState::kMaster, OptimizerState::kExpAvg, OptimizerState::kExpAvgSq}) {
        try {
          out.push_back(engine->state_shard(unit, kind));
        } catch (const std::invalid_argument&) {  // an optimizer without this moment
          out.emplace_back();
        }
      }
    }
    return out;
  }
};

inline void expect_same_state(const std::vector<std::vector<float>>& a,
                              const std::vector<std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << what;
    if (a[i].empty()) continue;  // a moment this optimizer does not keep
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << what << ": state array " << i << " (unit " << i / 3 << ", kind " << i % 3 << ") differs";
  }
}

}  // namespace strata::runtime::testing
