// Proves that the memory plan `strata plan` prints is what the Engine allocates: for several
// placements and both data paths, the Engine's measured device and host high-water marks equal the
// plan's tier totals (plan_to_json, as `strata plan --json` prints them) for the same units.
#include "runtime/plan/buffer_plan.hpp"

#include "base/units.hpp"

#include <cstdlib>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/partition.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"

namespace strata::runtime {
namespace {

using Access = EngineOptions::DeviceAccess;

// STRATA_FORCE_NVME=1 moves the Engine's state to NVMe behind the plan's back.
bool nvme_forced() {
  const char* force = std::getenv("STRATA_FORCE_NVME");
  return force != nullptr && force[0] == '1';
}

struct HighWater {
  std::uint64_t device = 0;
  std::uint64_t host = 0;
};

// `matrices_in_bf16`: the model's matrices without an fp32 view (TinyMlp::read_matrices_in_bf16).
HighWater train_and_measure(const Config& config, Access access, bool matrices_in_bf16 = false) {
  auto device = testing::host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm, EngineOptions{.device_access = access});
  testing::TinyMlp model(testing::kEngineTestWidths, 16, 7);
  if (matrices_in_bf16) model.read_matrices_in_bf16();
  if (access == Access::kStaged) model.set_device(*device);
  model.add_units(engine);
  engine.finalize();
  for (int step = 0; step < 2; ++step) {
    model.train_step(engine);
    engine.step();
  }
  return {engine.device_high_water_bytes(), engine.host_high_water_bytes()};
}

nlohmann::json printed_plan(const Config& config, Access access, bool matrices_in_bf16 = false) {
  Config planned = config;
  // The plan reads the data path from the device kind: the staged path is the CUDA one.
  if (access == Access::kStaged) planned.tiers.device.kind = DeviceKind::kCuda;
  PlanInputs inputs;
  inputs.ranks = 1;
  for (std::uint32_t layer = 0; layer + 1 < testing::kEngineTestWidths.size(); ++layer) {
    const std::uint64_t in = testing::kEngineTestWidths[layer];
    const std::uint64_t out = testing::kEngineTestWidths[layer + 1];
    inputs.unit_numels.push_back(in * out + out);
    inputs.params += in * out + out;
    if (matrices_in_bf16) {
      const std::vector<std::uint64_t> numels{in * out, out};
      inputs.unit_fp32_view_numels.push_back(
          pack_fp32_views(make_unit_layout(numels, 1), {false, true}).numel);
    }
  }
  return plan_to_json(make_memory_plan(planned, inputs), planned);
}

class PlanMatchesEngine
    : public ::testing::TestWithParam<std::tuple<Tier, Tier, Tier, Access, std::uint32_t>> {};

TEST_P(PlanMatchesEngine, HighWaterMarksEqualThePlansTierTotals) {
  if (nvme_forced()) GTEST_SKIP() << "STRATA_FORCE_NVME changes the placement under test";
  const auto [params, grads, optimizer, access, stage] = GetParam();
  io::testing::ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.params = params;
  config.zero.grads = grads;
  config.zero.optimizer = optimizer;
  config.zero.stage = stage;
  config.zero.buffer_count = 3;
  const nlohmann::json plan = printed_plan(config, access);
  const HighWater measured = train_and_measure(config, access);
  // On the staged path the test model hands its gradient over in device memory: one unit's
  // gradient (the largest, 72 x 40 + 40 fp32, in the device's 256-byte granules) is allocated
  // while reduce_grads runs. It is the model's memory, not the Engine's.
  const std::uint64_t model_gradient =
      access == Access::kStaged ? round_up((72 * 40 + 40) * sizeof(float), 256) : 0;
  EXPECT_EQ(measured.host, plan["tiers"]["host"]["total_bytes"].get<std::uint64_t>())
      << plan.dump(1);
  EXPECT_EQ(measured.device,
            plan["tiers"]["device"]["total_bytes"].get<std::uint64_t>() + model_gradient)
      << plan.dump(1);
}

// A model that reads its matrices in bf16 alone: the gathered units' fp32 views hold the biases
// only (runtime::pack_fp32_views), in the plan as in the Engine, and that is less memory. With
// fp16 parameters there is no bf16 view: every tensor is widened, in both.
TEST(BufferPlan, PackedFp32ViewsAreWhatTheEngineAllocates) {
  if (nvme_forced()) GTEST_SKIP() << "STRATA_FORCE_NVME changes the placement under test";
  for (const auto& [access, optimizer, params] :
       {std::tuple(Access::kAuto, Tier::kDevice, DType::kBf16),
        std::tuple(Access::kAuto, Tier::kNvme, DType::kBf16),
        std::tuple(Access::kStaged, Tier::kDevice, DType::kBf16),
        std::tuple(Access::kStaged, Tier::kNvme, DType::kBf16),
        std::tuple(Access::kStaged, Tier::kDevice, DType::kFp16)}) {
    {
      SCOPED_TRACE(fmt::format("{} path, optimizer on {}, {} params",
                               access == Access::kStaged ? "staged" : "direct", to_string(optimizer),
                               dtype_name(params)));
      io::testing::ScratchDir dir;
      Config config = testing::engine_test_config(dir.path().string());
      config.precision.params = params;
      config.zero.optimizer = optimizer;
      config.zero.buffer_count = 3;
      const nlohmann::json plan = printed_plan(config, access, true);
      const HighWater measured = train_and_measure(config, access, true);
      const std::uint64_t model_gradient =
          access == Access::kStaged ? round_up((72 * 40 + 40) * sizeof(float), 256) : 0;
      const std::uint64_t planned = plan["tiers"]["device"]["total_bytes"].get<std::uint64_t>();
      EXPECT_EQ(measured.device, planned + model_gradient) << plan.dump(1);
      EXPECT_EQ(measured.host, plan["tiers"]["host"]["total_bytes"].get<std::uint64_t>());
      const std::uint64_t whole =
          printed_plan(config, access)["tiers"]["device"]["total_bytes"].get<std::uint64_t>();
      if (params == DType::kBf16) {
        EXPECT_LT(planned, whole) << "the matrices' fp32 views are not counted";
      } else {
        EXPECT_EQ(planned, whole);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Placements, PlanMatchesEngine,
    ::testing::Values(
        std::make_tuple(Tier::kDevice, Tier::kDevice, Tier::kDevice, Access::kAuto, 3u),
        std::make_tuple(Tier::kDevice, Tier::kHost, Tier::kHost, Access::kAuto, 3u),
        std::make_tuple(Tier::kDevice, Tier::kHost, Tier::kNvme, Access::kAuto, 3u),
        std::make_tuple(Tier::kNvme, Tier::kNvme, Tier::kNvme, Access::kAuto, 3u),
        std::make_tuple(Tier::kHost, Tier::kDevice, Tier::kNvme, Access::kAuto, 2u),
        std::make_tuple(Tier::kDevice, Tier::kDevice, Tier::kHost, Access::kStaged, 3u),
        std::make_tuple(Tier::kDevice, Tier::kNvme, Tier::kNvme, Access::kStaged, 3u)),
    [](const auto& param_info) {
      return fmt::format("params_{}_grads_{}_optimizer_{}_{}_stage{}",
                         to_string(std::get<0>(param_info.param)), to_string(std::get<1>(param_info.param)),
                         to_string(std::get<2>(param_info.param)),
                         std::get<3>(param_info.param) == Access::kStaged ? "staged" : "direct",
                         std::get<4>(param_info.param));
    });

// [zero] optimizer_host_fraction keeps the longest run of whole units within the share on the
// host, and the plan still equals what the Engine allocates.
TEST(BufferPlan, OptimizerHostFractionKeepsWholeUnitsOnTheHost) {
  io::testing::ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.optimizer = Tier::kNvme;
  BufferPlanInputs inputs;
  inputs.unit_numels = {1800, 2920, 328};  // shards of 2048, 4096 and 2048 elements
  const std::uint64_t nvme_all = make_buffer_plan(config, inputs).nvme_state_bytes;
  for (const auto& [fraction, units, numel] :
       {std::tuple{0.25, 1u, 2048u}, std::tuple{0.5, 1u, 2048u}, std::tuple{0.75, 2u, 6144u},
        std::tuple{1.0, 3u, 8192u}}) {
    config.zero.optimizer_host_fraction = fraction;
    const BufferPlan plan = make_buffer_plan(config, inputs);
    EXPECT_EQ(plan.optimizer_share.units, units) << fraction;
    EXPECT_EQ(plan.optimizer_share.share_numel, numel) << fraction;
    EXPECT_EQ(plan.tier_of(ShardKind::kMaster, 0), Tier::kHost);
    EXPECT_EQ(plan.tier_of(ShardKind::kMaster, 2), units == 3 ? Tier::kHost : Tier::kNvme);
    EXPECT_EQ(plan.tier_of(ShardKind::kParam, 0), Tier::kDevice);  // only the optimizer moves
    // 12 bytes per element on the host; both NVMe slots of them gone.
    EXPECT_EQ(plan.host_state_bytes, numel * 12u) << fraction;
    EXPECT_EQ(plan.nvme_state_bytes, nvme_all - 2 * numel * 12u) << fraction;
    EXPECT_EQ(plan.any_nvme, units < 3) << fraction;
  }
  if (nvme_forced()) return;  // the knob zeroes the fraction behind the plan's back
  config.zero.optimizer_host_fraction = 0.75;
  config.zero.buffer_count = 3;
  const nlohmann::json printed = printed_plan(config, Access::kAuto);
  EXPECT_EQ(train_and_measure(config, Access::kAuto).host,
            printed["tiers"]["host"]["total_bytes"].get<std::uint64_t>())
      << printed.dump(1);
}

// [zero] optimizer_device_fraction keeps the first units' optimizer state on the device, and
// optimizer_host_fraction's run starts after them; the plan still equals what the Engine allocates
// on both data paths (on the staged one, with slots for a device-share unit that must be staged).
TEST(BufferPlan, OptimizerDeviceFractionKeepsTheFirstUnitsOnTheDevice) {
  io::testing::ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.optimizer = Tier::kNvme;
  BufferPlanInputs inputs;
  inputs.unit_numels = {1800, 2920, 328};  // shards of 2048, 4096 and 2048 elements
  const BufferPlan all_nvme = make_buffer_plan(config, inputs);
  config.zero.optimizer_device_fraction = 0.25;  // unit 0: 2048 of 8192
  config.zero.optimizer_host_fraction = 0.5;     // then unit 1: 4096
  const BufferPlan plan = make_buffer_plan(config, inputs);
  EXPECT_EQ(plan.optimizer_device_share.first_unit, 0u);
  EXPECT_EQ(plan.optimizer_device_share.units, 1u);
  EXPECT_EQ(plan.optimizer_device_share.share_numel, 2048u);
  EXPECT_EQ(plan.optimizer_share.first_unit, 1u);
  EXPECT_EQ(plan.optimizer_share.units, 1u);
  EXPECT_EQ(plan.optimizer_share.share_numel, 4096u);
  for (ShardKind kind : {ShardKind::kMaster, ShardKind::kExpAvg, ShardKind::kExpAvgSq}) {
    EXPECT_EQ(plan.tier_of(kind, 0), Tier::kDevice);
    EXPECT_EQ(plan.tier_of(kind, 1), Tier::kHost);
    EXPECT_EQ(plan.tier_of(kind, 2), Tier::kNvme);
  }
  EXPECT_EQ(plan.tier_of(ShardKind::kParam, 1), Tier::kDevice);  // params and grads stay home
  EXPECT_EQ(plan.tier_of(ShardKind::kGrad, 2), Tier::kDevice);
  // fp32 master and moments, 12 bytes an element; both NVMe slots of the moved units gone.
  EXPECT_EQ(plan.device_state_bytes, all_nvme.device_state_bytes + 2048u * 12);
  EXPECT_EQ(plan.host_state_bytes, all_nvme.host_state_bytes + 4096u * 12);
  EXPECT_EQ(plan.nvme_state_bytes, all_nvme.nvme_state_bytes - 2 * (2048u + 4096u) * 12);
  // A fraction too small for the first unit keeps none; the host share then starts at unit 0.
  config.zero.optimizer_device_fraction = 0.2;
  const BufferPlan none = make_buffer_plan(config, inputs);
  EXPECT_EQ(none.optimizer_device_share.units, 0u);
  EXPECT_EQ(none.tier_of(ShardKind::kMaster, 0), Tier::kHost);
  // Device staging slots for the optimizer's kinds on the staged path only when the share holds
  // a unit.
  inputs.device_addressable = false;
  config.zero.optimizer = Tier::kHost;
  config.zero.optimizer_host_fraction = 0;
  config.zero.optimizer_device_fraction = 0;
  const std::uint64_t slot_without = make_buffer_plan(config, inputs).device_staging_slot_bytes;
  config.zero.optimizer_device_fraction = 0.25;
  EXPECT_GT(make_buffer_plan(config, inputs).device_staging_slot_bytes, slot_without);
  if (nvme_forced()) return;  // the knob homes everything on NVMe behind the plan's back
  for (Access access : {Access::kAuto, Access::kStaged}) {
    const nlohmann::json printed = printed_plan(config, access);
    const HighWater measured = train_and_measure(config, access);
    // The test model's own gradient in device memory on the staged path (PlanMatchesEngine).
    const std::uint64_t model_gradient =
        access == Access::kStaged ? round_up((72 * 40 + 40) * sizeof(float), 256) : 0;
    EXPECT_EQ(measured.device,
              printed["tiers"]["device"]["total_bytes"].get<std::uint64_t>() + model_gradient)
        << printed.dump(1);
    EXPECT_EQ(measured.host, printed["tiers"]["host"]["total_bytes"].get<std::uint64_t>())
        << printed.dump(1);
  }
}

// [zero] params_host_fraction and grads_host_fraction split their kinds the same way: whole units,
// the others' homes untouched, and the plan still equals what the Engine allocates.
TEST(BufferPlan, ParamsAndGradsHostFractionsKeepWholeUnitsOnTheHost) {
  io::testing::ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.params = config.zero.grads = Tier::kNvme;
  config.zero.optimizer = Tier::kHost;
  BufferPlanInputs inputs;
  inputs.unit_numels = {1800, 2920, 328};  // shards of 2048, 4096 and 2048 elements
  const BufferPlan all_nvme = make_buffer_plan(config, inputs);
  config.zero.params_host_fraction = 0.75;  // units 0 and 1: 6144 of 8192 elements
  config.zero.grads_host_fraction = 0.25;   // unit 0: 2048
  const BufferPlan plan = make_buffer_plan(config, inputs);
  EXPECT_EQ(plan.params_share.units, 2u);
  EXPECT_EQ(plan.params_share.share_numel, 6144u);
  EXPECT_EQ(plan.grads_share.units, 1u);
  EXPECT_EQ(plan.grads_share.share_numel, 2048u);
  EXPECT_EQ(plan.optimizer_share.units, 0u);
  EXPECT_EQ(plan.tier_of(ShardKind::kParam, 1), Tier::kHost);
  EXPECT_EQ(plan.tier_of(ShardKind::kParam, 2), Tier::kNvme);
  EXPECT_EQ(plan.tier_of(ShardKind::kGrad, 0), Tier::kHost);
  EXPECT_EQ(plan.tier_of(ShardKind::kGrad, 1), Tier::kNvme);
  EXPECT_EQ(plan.tier_of(ShardKind::kMaster, 0), Tier::kHost);  // homed there anyway
  // bf16 parameters and gradients, 2 bytes an element; both NVMe slots of them gone.
  const std::uint64_t moved = 6144u * 2 + 2048u * 2;
  EXPECT_EQ(plan.host_state_bytes, all_nvme.host_state_bytes + moved);
  EXPECT_EQ(plan.nvme_state_bytes, all_nvme.nvme_state_bytes - 2 * moved);
  if (nvme_forced()) return;  // the knob zeroes the fractions behind the plan's back
  config.zero.buffer_count = 3;
  for (Access access : {Access::kAuto, Access::kStaged}) {
    io::testing::ScratchDir run_dir;  // a store of its own per run
    config.tiers.nvme.paths = {run_dir.path().string()};
    const nlohmann::json printed = printed_plan(config, access);
    EXPECT_EQ(train_and_measure(config, access).host,
              printed["tiers"]["host"]["total_bytes"].get<std::uint64_t>())
        << printed.dump(1);
  }
}

// The plan counts what finalize checks: a budget one byte short of the plan's need is refused.
TEST(BufferPlan, TheDeviceBudgetCheckIsThePlansNeed) {
  if (nvme_forced()) GTEST_SKIP() << "STRATA_FORCE_NVME changes the placement under test";
  io::testing::ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kDevice;
  BufferPlanInputs inputs;
  inputs.unit_numels = {1800, 2920, 328};
  const BufferPlan plan = make_buffer_plan(config, inputs);
  // bf16 params on the device: 3 shards of 2048/4096/2048 elements x (2 param + 2 grad + 12
  // optimizer) bytes; scratch: fp32 gradient of the largest padded unit (one rank: no reduced
  // shard, no send copy); one gathered unit of 4096 elements in fp32 + bf16.
  EXPECT_EQ(plan.device_state_bytes, 8192u * 16);
  EXPECT_EQ(plan.device_scratch_bytes(), 4096u * 4);
  EXPECT_EQ(plan.device_need_bytes(), 8192u * 16 + 4096 * 4 + 4096 * 6);
  // Two ranks add the reduced shard and the send copy (shards of 1024 / 2048 / 1024 elements).
  BufferPlanInputs two = inputs;
  two.ranks = 2;
  EXPECT_EQ(make_buffer_plan(config, two).device_scratch_bytes(), 4096u * 4 + 2048 * 4 + 2048 * 2);
  // The staged path with one rank and the gradients on the device: no padded gradient copy.
  BufferPlanInputs staged = inputs;
  staged.device_addressable = false;
  staged.collectives_on_device = false;
  const BufferPlan direct_to_home = make_buffer_plan(config, staged);
  EXPECT_TRUE(direct_to_home.grads_to_home);
  EXPECT_EQ(direct_to_home.grad_full_scratch_bytes, kDecayRunScratchBytes);
  config.tiers.device.budget_bytes = plan.device_need_bytes() - 1;
  auto device = testing::host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm);
  testing::TinyMlp model(testing::kEngineTestWidths, 16, 7);
  model.add_units(engine);
  EXPECT_THROW(engine.finalize(), std::runtime_error);
}

}  // namespace
}  // namespace strata::runtime

namespace strata::runtime {
namespace {

// [zero] overlap_optimizer: the copies that undo speculative updates cover the in-memory state an
// update writes (master, moments, parameters), unit by unit from the last, within half the host
// budget the rest of the plan leaves; none without the overlap or on the staged path. The
// placement tests above check the Engine allocates exactly this.
TEST(BufferPlan, UndoCopiesFillHalfTheFreeHostBudgetFromTheLastUnit) {
  io::testing::ScratchDir dir;
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.params = config.zero.grads = Tier::kDevice;
  config.zero.optimizer = Tier::kHost;
  BufferPlanInputs inputs;
  inputs.unit_numels = {1800, 2920, 328};  // shards of 2048, 4096 and 2048 elements
  // bf16 parameters in device memory the CPU addresses, fp32 master and moments on the host.
  const std::vector<std::uint64_t> updated = {2048u * 14, 4096u * 14, 2048u * 14};
  BufferPlan plan = make_buffer_plan(config, inputs);
  EXPECT_EQ(plan.undo_unit_bytes, updated);
  EXPECT_EQ(plan.undo_bytes, 8192u * 14);

  // Room for the last two units only: need + 2 x (their copies) + a little.
  config.tiers.host.budget_bytes = plan.host_need_bytes() - plan.undo_bytes + 2 * 6144u * 14 + 100;
  plan = make_buffer_plan(config, inputs);
  EXPECT_EQ(plan.undo_unit_bytes, (std::vector<std::uint64_t>{0, 4096u * 14, 2048u * 14}));
  EXPECT_LE(2 * plan.undo_bytes, config.tiers.host.budget_bytes - (plan.host_need_bytes() - plan.undo_bytes));

  config.tiers.host.budget_bytes = 64ull << 20;
  config.zero.optimizer = Tier::kNvme;  // nothing the update writes is in host memory but params
  plan = make_buffer_plan(config, inputs);
  EXPECT_EQ(plan.undo_unit_bytes, (std::vector<std::uint64_t>{2048u * 2, 4096u * 2, 2048u * 2}));

  config.zero.overlap_optimizer = false;
  EXPECT_EQ(make_buffer_plan(config, inputs).undo_bytes, 0u);
  config.zero.overlap_optimizer = true;
  inputs.device_addressable = false;  // the staged path updates in step()
  EXPECT_EQ(make_buffer_plan(config, inputs).undo_bytes, 0u);
}

}  // namespace
}  // namespace strata::runtime
