// Proves the memory plan's PCIe bytes per step on the CUDA data path, against figures worked out
// here from the units' shapes: gathers from host homes (once per step when the unit cache holds
// every unit, 2m - (2m - 1) r times otherwise), gradients every micro-batch, the CPU optimizer's
// staging of device-homed state, collectives on the host with several ranks, the printed line and
// JSON key, and no figure on the host device.
#include "runtime/plan/memory_plan.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/config/byte_size.hpp"
#include "tests/runtime/plan_test_config.hpp"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

// Units of whole shard granules (2048 elements, no padding) above [zero] persistence_threshold
// (100,000 elements), so each is gathered as the residency allows.
constexpr std::uint64_t kSmallUnit = 100 * 2048;
constexpr std::uint64_t kLargeUnit = 200 * 2048;
constexpr std::uint64_t kPsi = kSmallUnit + kLargeUnit;

Config cuda_config(Tier params, Tier grads, Tier optimizer, std::uint32_t micro_batches) {
  Config config = testing::roomy_plan_config();
  config.tiers.device.kind = DeviceKind::kCuda;
  config.zero.params = params;
  config.zero.grads = grads;
  config.zero.optimizer = optimizer;
  config.model.grad_accumulation = micro_batches;
  return config;
}

PlanInputs two_units(std::uint32_t ranks) {
  return PlanInputs(kPsi, ranks, {kSmallUnit, kLargeUnit});
}

// Parameters and gradients in host memory, one rank, every unit cached on the device: each unit's
// bf16 parameters go h2d once per step, its fp32 gradient d2h once per micro-batch (2).
TEST(PcieTraffic, HostHomesGatherOncePerStepWhenCachedAndMoveGradientsPerMicroBatch) {
  const MemoryPlan plan =
      make_memory_plan(cuda_config(Tier::kHost, Tier::kHost, Tier::kHost, 2), two_units(1));
  ASSERT_TRUE(plan.pcie.has_value());
  const PcieTraffic& pcie = *plan.pcie;
  EXPECT_EQ(pcie.gather_h2d_bytes, kPsi * 2);
  EXPECT_DOUBLE_EQ(pcie.gathers_per_unit, 1.0);
  EXPECT_EQ(pcie.grad_d2h_bytes, 2 * kPsi * 4);
  EXPECT_EQ(pcie.grad_h2d_bytes + pcie.gather_d2h_bytes, 0u);
  EXPECT_EQ(pcie.optimizer_h2d_bytes + pcie.optimizer_d2h_bytes, 0u);  // all on the host
  EXPECT_EQ(pcie.h2d_bytes(), kPsi * 2);
  EXPECT_EQ(pcie.d2h_bytes(), kPsi * 8);
  EXPECT_DOUBLE_EQ(pcie.bound_s(), static_cast<double>(kPsi * 8) / 25e9);
}

// Only Ψ known, stage 3: the plan keeps prefetch_depth + 1 = 3 of the 8 units gathered (r = 3/8),
// so a unit is gathered 2m - (2m - 1) r times per step; stages 0-2 keep every unit: once.
TEST(PcieTraffic, UnitsOutsideTheCacheAreGatheredForEveryForwardAndBackward) {
  for (std::uint32_t micro : {1u, 2u}) {
    Config config = cuda_config(Tier::kHost, Tier::kHost, Tier::kHost, micro);
    config.model.layers = 8;
    const std::uint64_t psi = 8 * kSmallUnit;
    const MemoryPlan plan = make_memory_plan(config, {psi, 1});
    ASSERT_TRUE(plan.pcie.has_value());
    const double gathers = 2.0 * micro - (2.0 * micro - 1) * 3.0 / 8.0;  // 1.625, 2.875
    EXPECT_DOUBLE_EQ(plan.pcie->gathers_per_unit, gathers) << micro << " micro-batches";
    EXPECT_EQ(plan.pcie->gather_h2d_bytes,
              static_cast<std::uint64_t>(gathers * static_cast<double>(psi * 2)));
    EXPECT_EQ(plan.pcie->grad_d2h_bytes, micro * psi * 4);

    config.zero.stage = 2;
    const MemoryPlan kept = make_memory_plan(config, {psi, 1});
    EXPECT_EQ(kept.pcie->gather_h2d_bytes, psi * 2) << micro << " micro-batches";
  }
}

// The offload default: parameters and gradients on the GPU, the optimizer on the host. The CPU
// update stages the gradient d2h (bf16; fp32 when micro-batches accumulate) and the new
// parameters h2d; gathers and gradients stay on the device.
TEST(PcieTraffic, TheCpuOptimizerStagesDeviceHomedState) {
  for (std::uint32_t micro : {1u, 2u}) {
    const MemoryPlan plan = make_memory_plan(
        cuda_config(Tier::kDevice, Tier::kDevice, Tier::kHost, micro), two_units(1));
    ASSERT_TRUE(plan.pcie.has_value());
    EXPECT_EQ(plan.pcie->optimizer_d2h_bytes, kPsi * (micro > 1 ? 4 : 2));
    EXPECT_EQ(plan.pcie->optimizer_h2d_bytes, kPsi * 2);
    EXPECT_EQ(plan.pcie->gather_h2d_bytes + plan.pcie->grad_d2h_bytes, 0u);
  }
  // The optimizer (fp32 master, exp_avg, exp_avg_sq) on the GPU with host gradients: the CPU
  // updates it, so it goes d2h and back, with the device-homed parameters it writes.
  const MemoryPlan plan =
      make_memory_plan(cuda_config(Tier::kDevice, Tier::kHost, Tier::kDevice, 1), two_units(1));
  EXPECT_EQ(plan.pcie->optimizer_d2h_bytes, kPsi * 12);
  EXPECT_EQ(plan.pcie->optimizer_h2d_bytes, kPsi * (12 + 2));
  EXPECT_EQ(plan.pcie->grad_d2h_bytes, kPsi * 4);
}

// [zero] optimizer_device_fraction: the units whose optimizer state the device keeps are updated
// there, so their gradients and parameters stay on the device; the CPU's units move as before.
TEST(PcieTraffic, TheOptimizersDeviceShareCrossesNothing) {
  Config config = cuda_config(Tier::kDevice, Tier::kDevice, Tier::kHost, 1);
  config.zero.optimizer_device_fraction = 0.34;  // the small unit: 204,800 of 614,400 elements
  const MemoryPlan plan = make_memory_plan(config, two_units(1));
  ASSERT_TRUE(plan.pcie.has_value());
  EXPECT_EQ(plan.pcie->optimizer_d2h_bytes, kLargeUnit * 2);
  EXPECT_EQ(plan.pcie->optimizer_h2d_bytes, kLargeUnit * 2);
  // The small unit's 12 bytes an element of master and moments are on the device tier.
  EXPECT_EQ(plan.tier(Tier::kDevice).state_bytes -
                make_memory_plan(cuda_config(Tier::kDevice, Tier::kDevice, Tier::kHost, 1),
                                 two_units(1))
                    .tier(Tier::kDevice)
                    .state_bytes,
            kSmallUnit * 12);
}

TEST(PcieTraffic, EverythingOnTheDeviceCrossesNothing) {
  const MemoryPlan plan =
      make_memory_plan(cuda_config(Tier::kDevice, Tier::kDevice, Tier::kDevice, 2), two_units(1));
  ASSERT_TRUE(plan.pcie.has_value());
  EXPECT_EQ(plan.pcie->h2d_bytes(), 0u);
  EXPECT_EQ(plan.pcie->d2h_bytes(), 0u);
  EXPECT_EQ(plan.pcie->bound_s(), 0.0);
}

// Two ranks, collectives on the host (the plan's data path): a gather sends the device-homed own
// shard d2h and takes the whole unit h2d; a gradient goes d2h whole (fp32) to be reduced and its
// shard comes back h2d to its device home.
TEST(PcieTraffic, SeveralRanksGatherAndReduceOnTheHost) {
  const std::uint64_t shard = kPsi / 2;
  const MemoryPlan plan =
      make_memory_plan(cuda_config(Tier::kDevice, Tier::kDevice, Tier::kHost, 1), two_units(2));
  ASSERT_TRUE(plan.pcie.has_value());
  const PcieTraffic& pcie = *plan.pcie;
  EXPECT_EQ(pcie.gather_h2d_bytes, kPsi * 2);
  EXPECT_EQ(pcie.gather_d2h_bytes, shard * 2);
  EXPECT_EQ(pcie.grad_d2h_bytes, kPsi * 4);
  EXPECT_EQ(pcie.grad_h2d_bytes, shard * 4);
  EXPECT_EQ(pcie.optimizer_d2h_bytes, shard * 2);
  EXPECT_EQ(pcie.optimizer_h2d_bytes, shard * 2);
}

TEST(PcieTraffic, TextLineAndJsonKeyCarryTheFigure) {
  const Config config = cuda_config(Tier::kHost, Tier::kHost, Tier::kHost, 2);
  PlanInputs inputs = two_units(1);
  inputs.pcie_bytes_per_s = 50e9;
  const MemoryPlan plan = make_memory_plan(config, inputs);
  const std::string text = render_plan_text(plan, config);
  EXPECT_THAT(text, HasSubstr("PCIe per optimizer step: h2d " +
                              format_decimal_bytes(static_cast<double>(kPsi * 2)) + ", d2h " +
                              format_decimal_bytes(static_cast<double>(kPsi * 8)) +
                              "; at 50 GB/s each way"));
  const nlohmann::json json = plan_to_json(plan, config);
  ASSERT_TRUE(json.contains("pcie"));
  EXPECT_EQ(json["pcie"]["h2d_bytes_per_step"].get<std::uint64_t>(), kPsi * 2);
  EXPECT_EQ(json["pcie"]["d2h_bytes_per_step"].get<std::uint64_t>(), kPsi * 8);
  EXPECT_DOUBLE_EQ(json["pcie"]["bound_s"].get<double>(), static_cast<double>(kPsi * 8) / 50e9);
}

TEST(PcieTraffic, HostDeviceHasNoPcieFigure) {
  Config config = cuda_config(Tier::kHost, Tier::kHost, Tier::kHost, 1);
  config.tiers.device.kind = DeviceKind::kHost;
  const MemoryPlan plan = make_memory_plan(config, two_units(1));
  EXPECT_FALSE(plan.pcie.has_value());
  EXPECT_THAT(render_plan_text(plan, config), ::testing::Not(HasSubstr("PCIe")));
  EXPECT_FALSE(plan_to_json(plan, config).contains("pcie"));
}

}  // namespace
}  // namespace strata::runtime
