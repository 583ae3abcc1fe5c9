// Proves the learning-rate schedule: warm-up, constant, linear and cosine decay give the values
// their formulas say at warm-up start and end, mid-decay and after the end, and the config loader
// rejects schedules that cannot work with an error naming the key.
#include "runtime/config/lr_schedule.hpp"

#include <cmath>
#include <numbers>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

OptimizerConfig schedule(LrScheduleKind kind, std::uint64_t warmup, std::uint64_t decay_end,
                         double min_lr) {
  OptimizerConfig optimizer;
  optimizer.lr = 1e-3;
  optimizer.schedule = kind;
  optimizer.warmup_steps = warmup;
  optimizer.lr_decay_steps = decay_end;
  optimizer.min_lr = min_lr;
  return optimizer;
}

TEST(LrSchedule, WarmupRampsLinearlyToLr) {
  for (const LrScheduleKind kind :
       {LrScheduleKind::kConstant, LrScheduleKind::kLinear, LrScheduleKind::kCosine}) {
    const OptimizerConfig optimizer =
        schedule(kind, 10, kind == LrScheduleKind::kConstant ? 0 : 110, 0);
    EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 1), 1e-4) << to_string(kind);  // warm-up start
    EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 5), 5e-4) << to_string(kind);
    EXPECT_EQ(scheduled_lr(optimizer, 10), 1e-3) << to_string(kind);  // warm-up end: exactly lr
  }
}

TEST(LrSchedule, ConstantHoldsLrAfterWarmupAndWithout) {
  EXPECT_EQ(scheduled_lr(schedule(LrScheduleKind::kConstant, 10, 0, 0), 11), 1e-3);
  EXPECT_EQ(scheduled_lr(schedule(LrScheduleKind::kConstant, 10, 0, 0), 1'000'000), 1e-3);
  EXPECT_EQ(scheduled_lr(schedule(LrScheduleKind::kConstant, 0, 0, 0), 1), 1e-3);
}

// Warm-up 10, decay to min_lr 1e-4 at step 110: step 60 is half-way through the decay.
TEST(LrSchedule, LinearDecaysToMinLrAndHoldsIt) {
  const OptimizerConfig optimizer = schedule(LrScheduleKind::kLinear, 10, 110, 1e-4);
  EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 11), 1e-4 + 9e-4 * 0.99);
  EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 60), 1e-4 + 9e-4 * 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 85), 1e-4 + 9e-4 * 0.25);
  EXPECT_EQ(scheduled_lr(optimizer, 110), 1e-4);
  EXPECT_EQ(scheduled_lr(optimizer, 111), 1e-4);
  EXPECT_EQ(scheduled_lr(optimizer, 5000), 1e-4);
}

TEST(LrSchedule, CosineDecaysToMinLrAndHoldsIt) {
  const OptimizerConfig optimizer = schedule(LrScheduleKind::kCosine, 10, 110, 1e-4);
  EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 60), 1e-4 + 9e-4 * 0.5);  // mid-decay: half-way
  // A quarter of the way: (1 + cos(pi / 4)) / 2 of the span above min_lr.
  EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 35),
                   1e-4 + 9e-4 * 0.5 * (1.0 + std::cos(std::numbers::pi / 4)));
  EXPECT_GT(scheduled_lr(optimizer, 35),
            scheduled_lr(schedule(LrScheduleKind::kLinear, 10, 110, 1e-4), 35));
  EXPECT_EQ(scheduled_lr(optimizer, 110), 1e-4);
  EXPECT_EQ(scheduled_lr(optimizer, 111), 1e-4);
  EXPECT_EQ(scheduled_lr(optimizer, 5000), 1e-4);
  // Non-increasing after the warm-up.
  for (std::uint64_t step = 11; step < 120; ++step) {
    EXPECT_LE(scheduled_lr(optimizer, step + 1), scheduled_lr(optimizer, step)) << step;
  }
}

TEST(LrSchedule, DecayWithoutWarmupStartsBelowLr) {
  const OptimizerConfig optimizer = schedule(LrScheduleKind::kLinear, 0, 4, 0);
  EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 1), 0.75e-3);
  EXPECT_DOUBLE_EQ(scheduled_lr(optimizer, 2), 0.5e-3);
  EXPECT_EQ(scheduled_lr(optimizer, 4), 0.0);
}

TEST(LrSchedule, ConfigReadsTheSchedule) {
  const Config config = parse_config(
      "[optimizer]\nlr = 6e-4\nwarmup_steps = 100\nschedule = \"cosine\"\nlr_decay_steps = 5000\n"
      "min_lr = 6e-5\n");
  EXPECT_EQ(config.optimizer.schedule, LrScheduleKind::kCosine);
  EXPECT_EQ(config.optimizer.lr_decay_steps, 5000u);
  EXPECT_EQ(config.optimizer.min_lr, 6e-5);
  EXPECT_EQ(parse_config("").optimizer.schedule, LrScheduleKind::kConstant);
}

// Parses `text` expecting a ConfigError; returns it for inspection.
ConfigError expect_error(const std::string& text) {
  try {
    parse_config(text, "run.toml");
  } catch (const ConfigError& error) {
    return error;
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return ConfigError("", 0, 0, "", "");
}

TEST(LrSchedule, ConfigRejectsSchedulesThatCannotWork) {
  {
    const ConfigError error = expect_error("[optimizer]\nschedule = \"cosine\"\n");
    EXPECT_EQ(error.key_path(), "optimizer.schedule");
    EXPECT_THAT(error.message(), HasSubstr("needs lr_decay_steps"));
  }
  {
    const ConfigError error = expect_error(
        "[optimizer]\nwarmup_steps = 100\nschedule = \"linear\"\nlr_decay_steps = 100\n");
    EXPECT_EQ(error.key_path(), "optimizer.lr_decay_steps");
    EXPECT_THAT(error.message(), HasSubstr("must be greater than warmup_steps (100)"));
  }
  {
    const ConfigError error = expect_error(
        "[optimizer]\nlr = 1e-4\nschedule = \"cosine\"\nlr_decay_steps = 10\nmin_lr = 1e-3\n");
    EXPECT_EQ(error.key_path(), "optimizer.min_lr");
    EXPECT_THAT(error.message(), HasSubstr("must not exceed lr"));
  }
  {
    const ConfigError error = expect_error("[optimizer]\nmin_lr = 1e-5\n");
    EXPECT_EQ(error.key_path(), "optimizer.min_lr");
    EXPECT_THAT(error.message(), HasSubstr("no effect with schedule = \"constant\""));
  }
  {
    const ConfigError error = expect_error("[optimizer]\nlr_decay_steps = 10\n");
    EXPECT_EQ(error.key_path(), "optimizer.lr_decay_steps");
  }
  {
    const ConfigError error = expect_error("[optimizer]\nschedule = \"cosin\"\n");
    EXPECT_EQ(error.key_path(), "optimizer.schedule");
    EXPECT_THAT(error.message(), HasSubstr("cosine"));
  }
}

}  // namespace
}  // namespace strata::runtime
