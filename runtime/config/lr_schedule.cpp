#include "runtime/config/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/assert.hpp"

namespace strata::runtime {

double scheduled_lr(const OptimizerConfig& optimizer, std::uint64_t step) {
  STRATA_ASSERT(step >= 1, "learning-rate steps are 1-based");
  const std::uint64_t warmup = optimizer.warmup_steps;
  if (step <= warmup) {
    return optimizer.lr * (static_cast<double>(step) / static_cast<double>(warmup));
  }
  if (optimizer.schedule == LrScheduleKind::kConstant) return optimizer.lr;
  STRATA_ASSERT(optimizer.lr_decay_steps > warmup, "decay must end after the warm-up");
  const double progress = std::min(1.0, static_cast<double>(step - warmup) /
                                            static_cast<double>(optimizer.lr_decay_steps - warmup));
  const double span = optimizer.lr - optimizer.min_lr;
  if (optimizer.schedule == LrScheduleKind::kLinear) {
    return optimizer.min_lr + span * (1.0 - progress);
  }
  return optimizer.min_lr + span * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace strata::runtime
