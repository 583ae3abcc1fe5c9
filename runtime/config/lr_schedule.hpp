// The learning rate of each optimizer step, from [optimizer] lr, warmup_steps, schedule,
// lr_decay_steps and min_lr. One pure function: the Engine calls it every step with its own step
// count, so a resumed or checkpoint-loaded run continues the schedule where it stopped.
//
// Step s (1-based, the update about to be taken):
//   s <= warmup_steps                      lr * s / warmup_steps
//   constant                               lr
//   linear, cosine: p = (s - warmup_steps) / (lr_decay_steps - warmup_steps), clamped to [0, 1]
//     linear                               min_lr + (lr - min_lr) * (1 - p)
//     cosine                               min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
// So the last warm-up step and the first decay step meet at lr, and step lr_decay_steps and every
// step after it use min_lr.
#pragma once

#include <cstdint>

#include "runtime/config/config.hpp"

namespace strata::runtime {

// `step` >= 1. The config must be valid (parse_config checks min_lr <= lr and
// lr_decay_steps > warmup_steps when decaying).
double scheduled_lr(const OptimizerConfig& optimizer, std::uint64_t step);

}  // namespace strata::runtime
