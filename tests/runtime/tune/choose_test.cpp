// Proves the tune choice on synthetic machines: the I/O point and thread count it keeps (from the
// rates of the update the config runs), the fastest predicted placement among those that fit
// (ties to the higher tier), the budgets respected, nothing when nothing fits, and the same answer
// every time.
#include <algorithm>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/tune/choose.hpp"

namespace strata::runtime::tune {
namespace {

MachineProfile synthetic_machine() {
  MachineProfile m;
  m.io = {{1 << 20, 16, 1, 2000, 1000, 1500},
          {4 << 20, 64, 2, 3000, 2000, 2500},
          {1 << 20, 64, 1, 2950, 1950, 2480}};
  m.host_memory_gb_per_s = 20;
  m.adam = {{1, 1e8}, {2, 1.99e8}, {4, 2e8}};
  return m;
}

Config config_with(const std::string& budgets) {
  return parse_config("[tiers.nvme]\npaths = [\"/tmp\"]\n[tiers.device]\nkind = \"host\"\n" +
                      budgets);
}

TEST(TuneChoice, KeepsTheFewestBytesInFlightNearTheBestMixedRate) {
  const std::optional<IoPoint> io = choose_io_point(synthetic_machine());
  ASSERT_TRUE(io.has_value());
  // 2480 MB/s is within 2% of 2500 with 64 MiB in flight instead of 512 MiB.
  EXPECT_EQ(io->block_bytes, 1u << 20);
  EXPECT_EQ(io->queue_depth, 64u);
  EXPECT_EQ(io->rings, 1u);
  EXPECT_FALSE(choose_io_point(MachineProfile{}).has_value());
}

// Rates closer than the grid's own noise (MachineProfile::io_noise, from the confirmations) are a
// tie, and the fewest bytes in flight win it.
TEST(TuneChoice, RatesWithinTheGridsNoiseAreATie) {
  MachineProfile m = synthetic_machine();
  m.io_noise = 0.25;  // depth 16's 1500 MB/s is 0.6 of the best 2500: not within 25%
  EXPECT_EQ(choose_io_point(m)->queue_depth, 64u);
  m.io_noise = 0.45;  // within 45%: a tie, and depth 16 has the fewest bytes in flight
  EXPECT_EQ(choose_io_point(m)->queue_depth, 16u);
  m.io_noise = 0.01;  // never tighter than 2%
  EXPECT_EQ(choose_io_point(m)->queue_depth, 64u);
}

// The point the Engine's own step ran fastest with wins over the probe's ranking.
TEST(TuneChoice, ThePointTimedOnTheEngineWins) {
  MachineProfile m = synthetic_machine();
  m.engine_io_point = 0;  // depth 16: the probe's slowest
  EXPECT_EQ(choose_io_point(m)->queue_depth, 16u);
  EXPECT_EQ(choose_io_point(m)->block_bytes, 1u << 20);
  m.engine_io_point = 7;  // out of range: ignored
  EXPECT_EQ(choose_io_point(m)->queue_depth, 64u);
}

TEST(TuneChoice, KeepsTheFewestThreadsNearTheBestAdamRate) {
  EXPECT_EQ(choose_adam_threads(synthetic_machine(), {}), 2u);
  MachineProfile m = synthetic_machine();
  m.adam[1].params_per_s = 1.5e8;
  EXPECT_EQ(choose_adam_threads(m, {}), 4u);
}

// The threads come from the rates of the update the config runs, not the fp32 one's.
TEST(TuneChoice, CompressedStateChoosesThreadsFromItsOwnUpdate) {
  const AdamUpdate int8{cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kInt8};
  MachineProfile m = synthetic_machine();  // fp32: 2 threads within 2% of the best
  m.adam.push_back({1, 0.5e8, int8});
  m.adam.push_back({2, 0.7e8, int8});
  m.adam.push_back({4, 1e8, int8});
  EXPECT_EQ(choose_adam_threads(m, int8), 4u);
  EXPECT_EQ(choose_adam_threads(MachineProfile{}, int8), 0u);
  Config base = config_with("budget = \"1TiB\"\n[tiers.host]\nbudget = \"1TiB\"\n");
  base.optimizer.master_dtype = cpu_adam::StateDType::kBf16;
  base.optimizer.state_dtype = cpu_adam::StateDType::kInt8;
  const std::optional<TuneChoice> choice = choose_config(base, PlanInputs(100'000'000, 1), m);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->config.optimizer.threads, 4u);
  EXPECT_DOUBLE_EQ(choice->prediction.adam_s,
                   static_cast<double>(choice->prediction.plan.params) / 1e8);
}

TEST(TuneChoice, GenerousBudgetsKeepEverythingOnTheDevice) {
  const Config base = config_with("budget = \"1TiB\"\n[tiers.host]\nbudget = \"1TiB\"\n");
  const std::optional<TuneChoice> choice =
      choose_config(base, PlanInputs(100'000'000, 1), synthetic_machine());
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->config.zero.params, Tier::kDevice);
  EXPECT_EQ(choice->config.zero.grads, Tier::kDevice);
  EXPECT_EQ(choice->config.zero.optimizer, Tier::kDevice);
  EXPECT_EQ(choice->config.optimizer.threads, 2u);
  EXPECT_EQ(choice->config.tiers.nvme.queue_depth, 64u);
  EXPECT_TRUE(choice->prediction.plan.fits());
  EXPECT_GT(choice->fitting, 0u);
  EXPECT_LE(choice->fitting, choice->candidates);
}

TEST(TuneChoice, TightBudgetsStreamTheOptimizerAndTheChoiceIsTheFastestThatFits) {
  // 100 M parameters: 1.2 GB of optimizer state, more than the host and device budgets hold.
  const Config base =
      config_with("budget = \"512MiB\"\n[tiers.host]\nbudget = \"256MiB\"\n");
  const PlanInputs inputs(100'000'000, 1);
  const MachineProfile machine = synthetic_machine();
  const std::optional<TuneChoice> choice = choose_config(base, inputs, machine);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->config.zero.optimizer, Tier::kNvme);
  EXPECT_TRUE(choice->prediction.plan.fits());
  EXPECT_EQ(choice->prediction.step_s, predict_step(choice->config, inputs, machine).step_s);
  // No neighbour one knob away that fits is predicted faster.
  for (std::uint64_t group : {choice->config.zero.sub_group_size / 2,
                              choice->config.zero.sub_group_size * 2}) {
    for (std::uint32_t buffers : {2u, 3u, 4u}) {
      Config other = choice->config;
      other.zero.sub_group_size = std::max<std::uint64_t>(1 << 16, group);
      other.zero.buffer_count = buffers;
      const StepPrediction p = predict_step(other, inputs, machine);
      if (p.plan.fits()) {
        EXPECT_GE(p.step_s, choice->prediction.step_s);
      }
    }
  }
}

// Parameters and gradients that fit neither the device nor, all of them, the host: they go to
// NVMe with as large a host share as the host budget holds (a larger share is faster but does not
// fit), and the choice fits.
TEST(TuneChoice, HostFractionsKeepWhatTheHostBudgetHoldsOfParamsAndGrads) {
  const Config base = config_with("budget = \"1GiB\"\n[tiers.host]\nbudget = \"640MiB\"\n");
  // 400 M parameters in 16 units: 800 MB of bf16 parameters, as much of gradients, 4.8 GB of
  // optimizer state.
  const PlanInputs inputs(400'000'000, 1, std::vector<std::uint64_t>(16, 25'000'000));
  const MachineProfile machine = synthetic_machine();
  const std::optional<TuneChoice> choice = choose_config(base, inputs, machine);
  ASSERT_TRUE(choice.has_value());
  const ZeroConfig& zero = choice->config.zero;
  EXPECT_TRUE(choice->prediction.plan.fits());
  EXPECT_GT(zero.params_host_fraction + zero.grads_host_fraction, 0.0)
      << "params " << to_string(zero.params) << ", grads " << to_string(zero.grads);
  for (double ZeroConfig::*fraction :
       {&ZeroConfig::params_host_fraction, &ZeroConfig::grads_host_fraction,
        &ZeroConfig::optimizer_host_fraction}) {
    if (choice->config.zero.*fraction >= 0.75) continue;
    Config more = choice->config;
    more.zero.*fraction += 0.25;
    const StepPrediction p = predict_step(more, inputs, machine);
    // A kind not on NVMe refuses a fraction; one on NVMe with more on the host does not fit.
    const bool on_nvme = (fraction == &ZeroConfig::params_host_fraction ? zero.params
                          : fraction == &ZeroConfig::grads_host_fraction ? zero.grads
                                                                         : zero.optimizer) ==
                         Tier::kNvme;
    if (on_nvme) {
      EXPECT_FALSE(p.plan.fits()) << more.zero.*fraction;
    }
  }
}

// A GPU whose budget holds the parameters, the gradients and part of the optimizer state: the
// optimizer goes to the host with the largest device share the budget holds (the device's update
// is faster than the CPU's and crosses no bus), and a larger share does not fit. On the host
// device the same budgets keep no share (the CPU updates "device" memory all the same).
TEST(TuneChoice, TheDeviceKeepsTheShareOfTheOptimizerItsBudgetHolds) {
  // 400 M parameters in 16 units: 800 MB of bf16 parameters, as much of gradients, 4.8 GB of
  // fp32 master and moments; a 3 GiB device holds a quarter of the optimizer state beside them.
  Config base = config_with("budget = \"3GiB\"\n[tiers.host]\nbudget = \"64GiB\"\n");
  base.tiers.device.kind = DeviceKind::kCuda;
  const PlanInputs inputs(400'000'000, 1, std::vector<std::uint64_t>(16, 25'000'000));
  MachineProfile machine = synthetic_machine();
  machine.h2d_gb_per_s = 20;
  machine.d2h_gb_per_s = 20;
  const std::optional<TuneChoice> choice = choose_config(base, inputs, machine);
  ASSERT_TRUE(choice.has_value());
  const ZeroConfig& zero = choice->config.zero;
  EXPECT_EQ(zero.params, Tier::kDevice);
  EXPECT_EQ(zero.grads, Tier::kDevice);
  EXPECT_NE(zero.optimizer, Tier::kDevice);
  EXPECT_GT(zero.optimizer_device_fraction, 0.0);
  EXPECT_LT(zero.optimizer_device_fraction, 1.0);
  Config more = choice->config;
  more.zero.optimizer_device_fraction += 0.25;
  EXPECT_FALSE(predict_step(more, inputs, machine).plan.fits()) << more.zero.optimizer_device_fraction;
  const auto reason = std::find_if(choice->reasons.begin(), choice->reasons.end(), [](const auto& r) {
    return r.first == "zero.optimizer_device_fraction";
  });
  ASSERT_NE(reason, choice->reasons.end());
  EXPECT_THAT(reason->second, ::testing::HasSubstr("the largest share the device budget holds"));
  base.tiers.device.kind = DeviceKind::kHost;
  const std::optional<TuneChoice> host = choose_config(base, inputs, machine);
  ASSERT_TRUE(host.has_value());
  EXPECT_EQ(host->config.zero.optimizer_device_fraction, 0.0);
}

TEST(TuneChoice, NothingWhenNoPlacementFits) {
  Config base = parse_config("[tiers.device]\nbudget = \"1MiB\"\n[tiers.host]\nbudget = \"1MiB\"\n");
  EXPECT_FALSE(choose_config(base, PlanInputs(100'000'000, 1), synthetic_machine()).has_value());
}

TEST(TuneChoice, NoNvmePlacementWithoutMeasuredDrives) {
  const Config base = config_with("budget = \"1TiB\"\n[tiers.host]\nbudget = \"1GiB\"\n");
  MachineProfile m = synthetic_machine();
  m.io.clear();
  const std::optional<TuneChoice> choice = choose_config(base, PlanInputs(100'000'000, 1), m);
  ASSERT_TRUE(choice.has_value());
  EXPECT_NE(choice->config.zero.optimizer, Tier::kNvme);
  EXPECT_NE(choice->config.zero.params, Tier::kNvme);
  EXPECT_NE(choice->config.zero.grads, Tier::kNvme);
}

TEST(TuneChoice, SameInputsSameChoice) {
  const Config base = config_with("budget = \"512MiB\"\n[tiers.host]\nbudget = \"256MiB\"\n");
  const auto a = choose_config(base, PlanInputs(100'000'000, 1), synthetic_machine());
  const auto b = choose_config(base, PlanInputs(100'000'000, 1), synthetic_machine());
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->config, b->config);
  EXPECT_EQ(a->prediction.step_s, b->prediction.step_s);
}

}  // namespace
}  // namespace strata::runtime::tune
