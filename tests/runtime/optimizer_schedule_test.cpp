// Proves the Engine's per-tensor weight decay and learning-rate schedule: in one sub-group,
// decayed and non-decayed tensors move exactly (bitwise) as a scalar AdamW with and without decay
// says, at the scheduled learning rate of every step, which StepStats reports; and a run loaded
// from a checkpoint or resumed from the NVMe store continues the schedule bitwise.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/config/lr_schedule.hpp"
#include "runtime/plan/partition.hpp"
#include "tests/io/io_test_support.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using ::testing::ElementsAre;

constexpr std::uint64_t kSeed = 20261129;

// 4,460 elements: with 2,048-element sub-groups the second sub-group holds the tail of "a.w", all
// of "a.b" and "ln.g" and the head of "c.w" (decay flags change three times inside it), and the
// third ends with "c.b" and padding.
UnitSpec mixed_unit() {
  UnitSpec unit;
  unit.name = "mixed";
  unit.tensors.push_back({"a.w", {50, 50}, TensorInit::normal(1.0f), true});
  unit.tensors.push_back({"a.b", {50}, TensorInit::zeros(), false});
  unit.tensors.push_back({"ln.g", {50}, TensorInit::ones(), false});
  unit.tensors.push_back({"c.w", {30, 60}, TensorInit::normal(1.0f), true});
  unit.tensors.push_back({"c.b", {60}, TensorInit::zeros(), false});
  return unit;
}

// Per element of the unit: does weight decay apply?
std::vector<bool> decay_flags(const UnitSpec& unit) {
  std::vector<bool> flags;
  for (const TensorSpec& tensor : unit.tensors)
    flags.insert(flags.end(), tensor.numel(), tensor.weight_decay);
  return flags;
}

Config mixed_config(const ScratchDir& dir) {
  Config config = parse_config(R"(
[tiers.device]
kind = "host"
budget = "64MiB"
[tiers.host]
budget = "64MiB"
[zero]
sub_group_size = 2048
[optimizer]
type = "adamw"
lr = 1e-2
betas = [0.9, 0.999]
weight_decay = 0.1
grad_clip = 0
[precision]
params = "fp32"
grads = "fp32"
)");
  config.tiers.nvme.paths = {dir.path().string()};
  return config;
}

// Starting weights, all non-zero (so decay moves every decayed element).
std::vector<float> initial_master(std::uint64_t numel) {
  std::mt19937_64 random(kSeed);
  std::uniform_real_distribution<float> uniform(0.25f, 1.0f);
  std::vector<float> values(numel);
  for (std::size_t i = 0; i < numel; ++i) values[i] = (i % 2 == 0 ? 1.0f : -1.0f) * uniform(random);
  return values;
}

// The gradient of step `step` (1-based); every third element is always zero, so only weight decay
// can move it.
std::vector<float> gradient(std::uint64_t numel, std::uint64_t step) {
  std::mt19937_64 random(kSeed + step);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(numel);
  for (std::size_t i = 0; i < numel; ++i) {
    const float value = normal(random);
    values[i] = i % 3 == 0 ? 0.0f : value;
  }
  return values;
}

// One Engine over the mixed unit on the host device.
class MixedRun {
 public:
  explicit MixedRun(const Config& config, const EngineOptions& options = {}) {
    tiers::DeviceOptions device_options;
    device_options.kind = tiers::DeviceKind::kHost;
    device_options.budget_bytes = config.tiers.device.budget_bytes;
    device_ = tiers::make_device(device_options);
    engine_ = std::make_unique<Engine>(config, *device_, comm_, options);
    unit_ = engine_->add_unit(mixed_unit());
    engine_->finalize();
  }

  void set_initial_master() {
    engine_->set_master(unit_, initial_master(engine_->unit_numel(unit_)));
  }

  // Feeds the gradient of the next step and steps; returns the learning rate StepStats reports.
  double step() {
    const std::vector<float> grads =
        gradient(engine_->unit_numel(unit_), engine_->step_count() + 1);
    engine_->reduce_grads(unit_, grads);
    const StepStats stats = engine_->step();
    EXPECT_FALSE(stats.skipped);
    return stats.lr;
  }

  std::vector<float> master() { return engine_->gather_master(unit_); }
  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<tiers::Device> device_;
  comm::LocalComm comm_;
  std::unique_ptr<Engine> engine_;
  UnitId unit_ = 0;
};

// AdamW one element at a time, in cpu_adam's fp32 arithmetic and order (docs/cpu_adam.md), with
// weight decay only where the tensor's flag says and the scheduled learning rate of every step.
std::vector<float> reference_adamw(const Config& config, int steps) {
  const UnitSpec unit = mixed_unit();
  const std::vector<bool> decays = decay_flags(unit);
  const OptimizerConfig& o = config.optimizer;
  std::vector<float> param = initial_master(decays.size());
  std::vector<float> exp_avg(decays.size(), 0.0f);
  std::vector<float> exp_avg_sq(decays.size(), 0.0f);
  for (int s = 1; s <= steps; ++s) {
    const double lr = scheduled_lr(o, static_cast<std::uint64_t>(s));
    const double t = s;
    const float step_size = static_cast<float>(lr / (1.0 - std::pow(o.beta1, t)));
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(o.beta2, t)));
    const float decay = static_cast<float>(1.0 - lr * o.weight_decay);
    const std::vector<float> grads = gradient(decays.size(), static_cast<std::uint64_t>(s));
    for (std::size_t i = 0; i < decays.size(); ++i) {
      const float g = grads[i];
      exp_avg[i] = static_cast<float>(o.beta1) * exp_avg[i] + static_cast<float>(1.0 - o.beta1) * g;
      exp_avg_sq[i] =
          static_cast<float>(o.beta2) * exp_avg_sq[i] + static_cast<float>(1.0 - o.beta2) * (g * g);
      const float denom = std::sqrt(exp_avg_sq[i]) * inv_sqrt_bc2 + static_cast<float>(o.eps);
      float p = param[i];
      if (decays[i]) p = p * decay;
      param[i] = p - step_size * (exp_avg[i] / denom);
    }
  }
  return param;
}

// Element index -> "tensor[i]" for failure messages.
std::string where(std::size_t element) {
  for (const TensorSpec& tensor : mixed_unit().tensors) {
    if (element < tensor.numel()) return fmt::format("{}[{}]", tensor.name, element);
    element -= tensor.numel();
  }
  return "padding";
}

void expect_matches_reference(const std::vector<float>& engine, const std::vector<float>& reference,
                              const std::string& what) {
  ASSERT_EQ(engine.size(), reference.size());
  int mismatches = 0;
  for (std::size_t i = 0; i < engine.size(); ++i) {
    if (std::memcmp(&engine[i], &reference[i], sizeof(float)) != 0 && ++mismatches <= 5) {
      ADD_FAILURE() << what << ": " << where(i) << " is " << engine[i] << ", AdamW says "
                    << reference[i];
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
}

std::vector<DecayRun> runs_of(const UnitSpec& unit, std::uint64_t begin, std::uint64_t numel) {
  std::vector<DecayRun> runs;
  for_each_decay_run(unit, make_unit_layout(unit, 1), begin, numel,
                     [&](const DecayRun& run) { runs.push_back(run); });
  return runs;
}

MATCHER_P3(IsRun, begin, numel, decay, "") {
  return arg.begin == begin && arg.numel == numel && arg.weight_decay == decay;
}

// Mixed unit: a.w [0, 2500) decayed, a.b [2500, 2550), ln.g [2550, 2600) not, c.w [2600, 4400)
// decayed, c.b [4400, 4460) not, padding after.
TEST(DecayRuns, CutWhereTheFlagChangesAndNowhereElse) {
  const UnitSpec unit = mixed_unit();
  EXPECT_THAT(runs_of(unit, 0, 2048), ElementsAre(IsRun(0u, 2048u, true)));
  EXPECT_THAT(runs_of(unit, 2048, 2048),
              ElementsAre(IsRun(0u, 452u, true), IsRun(452u, 100u, false),  // a.b and ln.g: one
                          IsRun(552u, 1496u, true)));
  // c.b and the padding after it: one undecayed run.
  EXPECT_THAT(runs_of(unit, 4096, 2048),
              ElementsAre(IsRun(0u, 304u, true), IsRun(304u, 1744u, false)));
  EXPECT_THAT(runs_of(unit, 2500, 100), ElementsAre(IsRun(0u, 100u, false)));
  EXPECT_THAT(runs_of(unit, 5000, 100), ElementsAre(IsRun(0u, 100u, false)));  // padding alone
  EXPECT_THAT(runs_of(unit, 0, 0), ElementsAre());
}

class OptimizerWeightDecay : public ::testing::TestWithParam<Tier> {};

TEST_P(OptimizerWeightDecay, DecayedAndUndecayedTensorsInOneSubGroupMoveAsAdamWSays) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  constexpr int kSteps = 3;
  ScratchDir dir;
  Config config = mixed_config(dir);
  config.zero.optimizer = GetParam();
  MixedRun run(config);
  run.set_initial_master();
  const std::vector<float> before = run.master();
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(run.step(), 1e-2);
  const std::vector<float> after = run.master();
  expect_matches_reference(after, reference_adamw(config, kSteps), "weight decay per tensor");

  // Elements whose gradient was always zero: only decay moves them, and only where it applies.
  const std::vector<bool> decays = decay_flags(mixed_unit());
  const float factor = static_cast<float>(1.0 - 1e-2 * 0.1);
  for (std::size_t i = 0; i < decays.size(); i += 3) {
    if (decays[i]) {
      EXPECT_EQ(after[i], before[i] * factor * factor * factor) << where(i);
    } else {
      EXPECT_EQ(after[i], before[i]) << where(i) << " is not decayed, yet it moved";
    }
  }

  // Without decay the same run is plain Adam everywhere: the decayed tensors are what changed.
  ScratchDir plain_dir;
  Config plain = mixed_config(plain_dir);
  plain.zero.optimizer = GetParam();
  plain.optimizer.weight_decay = 0;
  MixedRun undecayed(plain);
  undecayed.set_initial_master();
  for (int s = 0; s < kSteps; ++s) undecayed.step();
  const std::vector<float> plain_after = undecayed.master();
  for (std::size_t i = 0; i < decays.size(); ++i) {
    if (decays[i]) {
      ASSERT_NE(plain_after[i], after[i]) << where(i);
    } else {
      ASSERT_EQ(plain_after[i], after[i]) << where(i);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OptimizerTiers, OptimizerWeightDecay,
                         ::testing::Values(Tier::kDevice, Tier::kHost, Tier::kNvme),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param));
                         });

// Warm-up 2 steps, cosine decay to min_lr at step 5, then min_lr: 7 steps see all three phases.
Config scheduled_config(const ScratchDir& dir) {
  Config config = mixed_config(dir);
  config.optimizer.warmup_steps = 2;
  config.optimizer.schedule = LrScheduleKind::kCosine;
  config.optimizer.lr_decay_steps = 5;
  config.optimizer.min_lr = 1e-3;
  return config;
}
constexpr int kScheduledSteps = 7;

TEST(OptimizerSchedule, EngineStepsAtTheScheduledLearningRateAndReportsIt) {
  ScratchDir dir;
  const Config config = scheduled_config(dir);
  MixedRun run(config);
  run.set_initial_master();
  for (int s = 1; s <= kScheduledSteps; ++s) {
    EXPECT_EQ(run.step(), scheduled_lr(config.optimizer, static_cast<std::uint64_t>(s))) << s;
  }
  expect_matches_reference(run.master(), reference_adamw(config, kScheduledSteps),
                           "cosine schedule");
}

TEST(OptimizerSchedule, CheckpointLoadedRunContinuesTheSchedule) {
  ScratchDir dir;
  const Config config = scheduled_config(dir);
  const std::filesystem::path checkpoint = dir.path() / "ckpt";
  {
    MixedRun first(config);
    first.set_initial_master();
    for (int s = 0; s < 3; ++s) first.step();
    first.engine().save(checkpoint);
  }
  ScratchDir other_dir;
  MixedRun second(scheduled_config(other_dir));
  second.engine().load(checkpoint);
  ASSERT_EQ(second.engine().step_count(), 3u);
  for (int s = 4; s <= kScheduledSteps; ++s) {
    EXPECT_EQ(second.step(), scheduled_lr(config.optimizer, static_cast<std::uint64_t>(s))) << s;
  }
  expect_matches_reference(second.master(), reference_adamw(config, kScheduledSteps),
                           "saved after step 3, loaded, continued");
}

TEST(OptimizerSchedule, ResumedRunContinuesTheSchedule) {
  ScratchDir dir;
  Config config = scheduled_config(dir);
  config.zero.params = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  {
    MixedRun first(config);
    first.set_initial_master();
    for (int s = 0; s < 4; ++s) first.step();
  }
  MixedRun resumed(config, EngineOptions{.resume = true});
  ASSERT_EQ(resumed.engine().step_count(), 4u);
  for (int s = 5; s <= kScheduledSteps; ++s) {
    EXPECT_EQ(resumed.step(), scheduled_lr(config.optimizer, static_cast<std::uint64_t>(s))) << s;
  }
  expect_matches_reference(resumed.master(), reference_adamw(config, kScheduledSteps),
                           "resumed from the NVMe store at step 4");
}

}  // namespace
}  // namespace strata::runtime
