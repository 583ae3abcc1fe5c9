// Proves the memory plan's arithmetic: the seeds' ZeRO table, tier totals against budgets, NVMe
// traffic, communication volume, and suggestions when the plan does not fit.
#include "runtime/plan/memory_plan.hpp"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/runtime/plan_test_config.hpp"

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

Config roomy_config() { return testing::roomy_plan_config(); }

// The seeds' table: Ψ = 7.5e9, N = 64, K = 12 gives 120.0, 31.4, 16.6 and 1.9 GB per GPU.
TEST(MemoryPlan, ReproducesTheSeedsZeroTable) {
  const double expected_gb[] = {120.0, 31.4, 16.6, 1.9};
  const double exact_bytes[] = {120e9, 31.40625e9, 16.640625e9, 1.875e9};
  for (std::uint32_t stage = 0; stage <= 3; ++stage) {
    Config config = roomy_config();
    config.zero.stage = stage;
    const MemoryPlan plan = make_memory_plan(config, {7'500'000'000, 64});
    const double bytes = static_cast<double>(plan.model_state_bytes_per_rank());
    EXPECT_DOUBLE_EQ(bytes, exact_bytes[stage]) << "stage " << stage;
    EXPECT_DOUBLE_EQ(std::round(bytes / 1e8) / 10.0, expected_gb[stage]) << "stage " << stage;
  }
}

TEST(MemoryPlan, CommunicationIsTwoPsiThenThreePsi) {
  for (std::uint32_t stage = 0; stage <= 3; ++stage) {
    Config config = roomy_config();
    config.zero.stage = stage;
    const MemoryPlan plan = make_memory_plan(config, {7'500'000'000, 64});
    EXPECT_DOUBLE_EQ(plan.comm_elements_per_rank, (stage == 3 ? 3.0 : 2.0) * 7.5e9);
    // bf16 gathers and bf16 gradient reduce-scatter: 2 bytes per element moved.
    EXPECT_EQ(plan.comm_bytes_per_rank, static_cast<std::uint64_t>((stage == 3 ? 6 : 4) * 7.5e9));
  }
  const MemoryPlan single = make_memory_plan(roomy_config(), {1'000'000, 1});
  EXPECT_EQ(single.comm_elements_per_rank, 0.0);
  EXPECT_EQ(single.comm_bytes_per_rank, 0u);
}

// The gradient share follows [precision] reduce_dtype: "auto" reduces bf16 gradients in bf16 with
// one micro-batch, in fp32 when micro-batches accumulate; an explicit dtype is taken as given.
TEST(MemoryPlan, GradientReduceScatterBytesFollowTheReduceDtype) {
  const auto comm_bytes = [](std::optional<DType> reduce, std::uint32_t accumulation) {
    Config config = roomy_config();
    config.zero.stage = 3;
    config.precision.reduce_dtype = reduce;
    config.model.grad_accumulation = accumulation;
    const MemoryPlan plan = make_memory_plan(config, {1'000'000, 8});
    return std::pair(plan.comm_bytes_per_rank, plan.reduce_dtype);
  };
  const std::uint64_t gathers = 2 * 2 * 1'000'000;  // two bf16 parameter gathers per micro-batch
  EXPECT_EQ(comm_bytes(std::nullopt, 1), std::pair(gathers + 2'000'000, DType::kBf16));
  EXPECT_EQ(comm_bytes(std::nullopt, 4), std::pair(4 * (gathers + 4'000'000), DType::kFp32));
  EXPECT_EQ(comm_bytes(DType::kFp32, 1), std::pair(gathers + 4'000'000, DType::kFp32));
  EXPECT_EQ(comm_bytes(DType::kBf16, 4), std::pair(4 * (gathers + 2'000'000), DType::kBf16));
}

// Every micro-batch reduce-scatters its gradients; at stage 3 it also gathers for its forward and
// its backward, while stages 0-2 gather once per step: (1 + m)Ψ and 3mΨ.
TEST(MemoryPlan, CommunicationCountsEveryMicroBatch) {
  for (std::uint32_t stage : {2u, 3u}) {
    Config config = roomy_config();
    config.zero.stage = stage;
    config.model.grad_accumulation = 4;
    const MemoryPlan plan = make_memory_plan(config, {1'000'000, 8});
    EXPECT_DOUBLE_EQ(plan.comm_elements_per_rank, (stage == 3 ? 12.0 : 5.0) * 1e6);
    EXPECT_EQ(plan.micro_batches, 4u);
    const std::string text = render_plan_text(plan, config);
    EXPECT_NE(text.find(stage == 3 ? "12Ψ" : "5Ψ"), std::string::npos) << text;
    EXPECT_NE(text.find("once per micro-batch: 4 per step"), std::string::npos) << text;
  }
}

TEST(MemoryPlan, StateGoesToItsHomeTier) {
  Config config = roomy_config();
  config.zero.params = Tier::kDevice;
  config.zero.grads = Tier::kHost;
  config.zero.optimizer = Tier::kNvme;
  config.zero.sub_group_size = 1000;
  config.zero.buffer_count = 3;
  config.zero.prefetch_depth = 1;
  config.zero.overlap_optimizer = false;  // no undo copies (UndoCopiesFillHalfTheFreeHostBudget)
  const std::uint64_t psi = 4'000'000;
  const MemoryPlan plan = make_memory_plan(config, {psi, 4});
  const std::uint64_t shard = psi / 4;
  EXPECT_EQ(plan.tier(Tier::kDevice).state_bytes, 2 * shard);
  EXPECT_EQ(plan.tier(Tier::kHost).state_bytes, 2 * shard);
  EXPECT_EQ(plan.tier(Tier::kNvme).state_bytes, 2 * 12 * shard);  // A/B slots
  // The buffers are the Engine's (runtime/plan/buffer_plan.hpp), so they carry its rounding: a
  // sub-group is a whole number of 2048-element granules (1000 -> 2048), a rank's shard of a unit
  // too, and each pinned buffer a whole number of 4 KiB pages.
  // Host staging: buffer_count sub-groups of each kind homed on NVMe (three fp32 arrays).
  EXPECT_EQ(plan.tier(Tier::kHost).buffer_bytes, 3u * 3 * (2048 * 4));
  // Device: (prefetch_depth + 1) gathered units (bf16 + fp32 copy), one unit's fp32 gradient, its
  // reduced fp32 shard and the bf16 send copy of the parameter shard.
  const std::uint64_t unit = plan.unit_elements;
  const std::uint64_t unit_shard = (unit + 4 * 2048 - 1) / (4 * 2048) * 2048;
  const std::uint64_t padded = 4 * unit_shard;
  EXPECT_EQ(plan.tier(Tier::kDevice).buffer_bytes, 2 * padded * 6 + padded * 4 + unit_shard * 6);
  EXPECT_EQ(plan.nvme_read_bytes_per_step, 12 * shard);
  EXPECT_EQ(plan.nvme_write_bytes_per_step, 12 * shard);
  EXPECT_TRUE(plan.fits());
}

TEST(MemoryPlan, ParamsAndGradsOnNvmeCountTheirTraffic) {
  Config config = roomy_config();
  config.zero.params = Tier::kNvme;
  config.zero.grads = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  const std::uint64_t psi = 8'000'000;
  const MemoryPlan plan = make_memory_plan(config, {psi, 2});
  const std::uint64_t shard = psi / 2;
  // Optimizer 12 read + 12 written; grads 2 written + 2 read; params read twice (forward and
  // backward gathers) and written once.
  EXPECT_EQ(plan.nvme_read_bytes_per_step, (12 + 2 + 4) * shard);
  EXPECT_EQ(plan.nvme_write_bytes_per_step, (12 + 2 + 2) * shard);
}

// [zero] params_host_fraction and grads_host_fraction: `strata plan` shows each kind's share on
// the host, moves it from the NVMe tier (both slots) to the host tier, and drops its NVMe traffic.
TEST(MemoryPlan, HostFractionsSplitParamsAndGrads) {
  Config config = roomy_config();
  config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kNvme;
  config.zero.sub_group_size = 2048;
  // Four units of 2^20 elements on one rank: a fraction of 0.5 keeps two of them.
  const std::vector<std::uint64_t> units(4, std::uint64_t{1} << 20);
  const PlanInputs inputs(4u << 20, 1, units);
  const MemoryPlan all_nvme = make_memory_plan(config, inputs);
  config.zero.params_host_fraction = 0.5;
  config.zero.grads_host_fraction = 0.25;
  const MemoryPlan plan = make_memory_plan(config, inputs);
  const std::uint64_t unit = 1u << 20;
  // bf16 parameters and gradients: 2 bytes an element.
  const std::uint64_t moved = 2 * unit * 2 + 1 * unit * 2;
  EXPECT_EQ(plan.tier(Tier::kHost).state_bytes, all_nvme.tier(Tier::kHost).state_bytes + moved);
  EXPECT_EQ(plan.tier(Tier::kNvme).state_bytes,
            all_nvme.tier(Tier::kNvme).state_bytes - 2 * moved);
  // Parameters: read twice and written once less per unit kept; gradients once each way.
  EXPECT_EQ(plan.nvme_read_bytes_per_step,
            all_nvme.nvme_read_bytes_per_step - 2 * (2 * unit * 2) - unit * 2);
  EXPECT_EQ(plan.nvme_write_bytes_per_step,
            all_nvme.nvme_write_bytes_per_step - 2 * unit * 2 - unit * 2);
  EXPECT_EQ(plan.states[0].host_bytes_per_rank, 2 * unit * 2);
  EXPECT_EQ(plan.states[1].host_bytes_per_rank, unit * 2);
  const std::string text = render_plan_text(plan, config);
  EXPECT_THAT(text, HasSubstr("bf16 (50% on host)"));
  EXPECT_THAT(text, HasSubstr("bf16 (25% on host)"));
  EXPECT_EQ(plan_to_json(plan, config)["states"][0]["host_bytes_per_rank"].get<std::uint64_t>(),
            2 * unit * 2);
}

// [tiers.host] nvme_read_cache: the spare host budget is the cache's room (a host buffer row, at
// most one slot of every extent); with room for all of it, no NVMe reads are left, the writes are.
TEST(MemoryPlan, NvmeReadCacheTakesTheSpareHostBudgetAndTheReads) {
  Config config = roomy_config();
  config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kNvme;
  config.tiers.host.budget_bytes = std::uint64_t{64} << 30;
  const PlanInputs inputs(8'000'000, 1, std::vector<std::uint64_t>(4, 2'000'000));
  const MemoryPlan uncached = make_memory_plan(config, inputs);
  config.tiers.host.nvme_read_cache = true;
  const MemoryPlan cached = make_memory_plan(config, inputs);
  const std::uint64_t one_slot = cached.tier(Tier::kNvme).state_bytes / 2;
  EXPECT_EQ(cached.tier(Tier::kHost).buffer_bytes,
            uncached.tier(Tier::kHost).buffer_bytes + one_slot);
  EXPECT_THAT(render_plan_text(cached, config), HasSubstr("NVMe read cache"));
  EXPECT_EQ(cached.nvme_read_bytes_per_step, 0u);
  EXPECT_EQ(cached.nvme_write_bytes_per_step, uncached.nvme_write_bytes_per_step);
  EXPECT_TRUE(cached.fits());
  // A budget with room for half the slots: half the reads.
  config.tiers.host.budget_bytes = uncached.tier(Tier::kHost).total_bytes() + one_slot / 2;
  const MemoryPlan half = make_memory_plan(config, inputs);
  EXPECT_NEAR(static_cast<double>(half.nvme_read_bytes_per_step),
              0.5 * static_cast<double>(uncached.nvme_read_bytes_per_step), 1.0);
  EXPECT_EQ(half.tier(Tier::kHost).total_bytes(), config.tiers.host.budget_bytes);
}

TEST(MemoryPlan, OverBudgetSaysWhichTierAndHowMuch) {
  Config config = roomy_config();
  config.zero.optimizer = Tier::kHost;
  config.tiers.host.budget_bytes = 1ull << 30;
  const std::uint64_t psi = 1'000'000'000;  // 12 GB of optimizer state on one rank
  const MemoryPlan plan = make_memory_plan(config, {psi, 1});
  EXPECT_FALSE(plan.fits());
  EXPECT_FALSE(plan.tier(Tier::kHost).fits());
  EXPECT_EQ(plan.tier(Tier::kHost).short_bytes(), 12 * psi - (1ull << 30));
  ASSERT_FALSE(plan.suggestions.empty());
  EXPECT_THAT(plan.suggestions[0], HasSubstr("raise [tiers.host] budget"));
  bool suggests_nvme = false;
  for (const std::string& suggestion : plan.suggestions) {
    suggests_nvme |= suggestion.find("[zero] optimizer = \"nvme\"") != std::string::npos;
  }
  EXPECT_TRUE(suggests_nvme) << "no suggestion to move the optimizer state to NVMe";
  const std::string text = render_plan_text(plan, config);
  EXPECT_THAT(text, HasSubstr("does not fit: the host tier is short by"));
}

TEST(MemoryPlan, SmallerSubGroupIsSuggestedWhenStagingIsTooBig) {
  Config config = roomy_config();
  config.zero.optimizer = Tier::kNvme;
  config.zero.sub_group_size = 100'000'000;
  config.tiers.host.budget_bytes = 64ull << 20;
  const MemoryPlan plan = make_memory_plan(config, {1'000'000'000, 1});
  EXPECT_FALSE(plan.tier(Tier::kHost).fits());
  bool found = false;
  for (const std::string& suggestion : plan.suggestions) {
    found |= suggestion.find("sub_group_size =") != std::string::npos;
  }
  EXPECT_TRUE(found);
}

TEST(MemoryPlan, JsonCarriesTheSameFigures) {
  const Config config = roomy_config();
  const MemoryPlan plan = make_memory_plan(config, {7'500'000'000, 64});
  const nlohmann::json json = plan_to_json(plan, config);
  EXPECT_EQ(json["model_state_bytes_per_rank"].get<std::uint64_t>(), 1'875'000'000u);
  EXPECT_EQ(json["states"].size(), 3u);
  EXPECT_EQ(json["tiers"]["host"]["state_bytes"].get<std::uint64_t>(),
            plan.tier(Tier::kHost).state_bytes);
  EXPECT_TRUE(json["fits"].get<bool>());
}

}  // namespace
}  // namespace strata::runtime
