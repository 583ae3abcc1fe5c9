// Proves strata bench step's overlap figures tell a serial step from an overlapped one even when
// one phase is small (where max(t_io, t_adam) / t_step stays near 1 either way).
#include "runtime/engine/step_overlap.hpp"

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

TEST(StepOverlap, ASerialStepHidesNothingThoughItsRatioLooksHigh) {
  // docs/benchmarks.md's serial 1e9-parameter row: t_io 19.35 s, t_adam 1.19 s, t_step 21.19 s.
  const StepOverlap overlap = step_overlap(19.35, 1.19, 21.19);
  EXPECT_NEAR(overlap.ratio, 0.913, 1e-3);
  EXPECT_EQ(overlap.hidden_fraction, 0.0);
  EXPECT_NEAR(overlap.exposed_io_s, 20.00, 1e-9);
  EXPECT_NEAR(overlap.exposed_adam_s, 1.84, 1e-9);
}

TEST(StepOverlap, AFullyOverlappedStepExposesOnlyTheLargerPhase) {
  const StepOverlap overlap = step_overlap(10.0, 4.0, 10.0);
  EXPECT_EQ(overlap.hidden_fraction, 1.0);
  EXPECT_EQ(overlap.exposed_adam_s, 0.0);
  EXPECT_EQ(overlap.exposed_io_s, 6.0);
  EXPECT_EQ(overlap.ratio, 1.0);
}

TEST(StepOverlap, HalfTheSmallerPhaseHidden) {
  const StepOverlap overlap = step_overlap(10.0, 4.0, 12.0);
  EXPECT_DOUBLE_EQ(overlap.hidden_fraction, 0.5);
  EXPECT_DOUBLE_EQ(overlap.exposed_adam_s, 2.0);
}

TEST(StepOverlap, ZeroTimesGiveZeroFigures) {
  const StepOverlap overlap = step_overlap(0.0, 0.0, 0.0);
  EXPECT_EQ(overlap.hidden_fraction, 0.0);
  EXPECT_EQ(overlap.ratio, 0.0);
}

}  // namespace
}  // namespace strata::runtime
