// ReferenceAdamW: a plain scalar AdamW over a ParameterStore, for tests and for comparing the
// Engine's optimizer pipeline against. Decoupled weight decay applies to matrices and embeddings
// (the tensors whose spec says weight_decay: rank >= 2), never to biases and LayerNorm gains, as
// GPT-2 training does; the learning rate follows the same schedule as the Engine's.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt/parameter_store.hpp"
#include "runtime/config/config.hpp"

namespace strata::gpt {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // global L2 norm; 0 disables
  // The learning-rate schedule, as [optimizer] gives it (runtime/config/lr_schedule.hpp); lr is its peak.
  std::uint64_t warmup_steps = 0;
  runtime::LrScheduleKind schedule = runtime::LrScheduleKind::kConstant;
  std::uint64_t lr_decay_steps = 0;
  double min_lr = 0.0;
};

// The options an Engine with this [optimizer] section uses (AdamW, bias correction on).
AdamWOptions adamw_options(const runtime::OptimizerConfig& optimizer);

class ReferenceAdamW {
 public:
  ReferenceAdamW(const ParameterStore& params, AdamWOptions options);
  // One step: clips `grads` by the global norm (in place), then updates `params`. Returns the
  // global gradient norm before clipping.
  double step(ParameterStore& params, ParameterStore& grads);
  std::uint64_t steps() const { return steps_; }

 private:
  AdamWOptions options_;
  std::uint64_t steps_ = 0;
  std::vector<std::vector<float>> exp_avg_, exp_avg_sq_;  // per unit, flat
};

}  // namespace strata::gpt
