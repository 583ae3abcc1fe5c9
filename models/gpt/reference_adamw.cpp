#include "models/gpt/reference_adamw.hpp"

#include <cmath>

#include "base/assert.hpp"
#include "runtime/config/lr_schedule.hpp"

namespace strata::gpt {

namespace {

runtime::OptimizerConfig schedule_of(const AdamWOptions& options) {
  runtime::OptimizerConfig optimizer;
  optimizer.lr = options.lr;
  optimizer.warmup_steps = options.warmup_steps;
  optimizer.schedule = options.schedule;
  optimizer.lr_decay_steps = options.lr_decay_steps;
  optimizer.min_lr = options.min_lr;
  return optimizer;
}

}  // namespace

AdamWOptions adamw_options(const runtime::OptimizerConfig& optimizer) {
  STRATA_ASSERT(optimizer.type == runtime::OptimizerType::kAdamW && optimizer.bias_correction);
  return AdamWOptions{.lr = optimizer.lr,
                      .beta1 = optimizer.beta1,
                      .beta2 = optimizer.beta2,
                      .eps = optimizer.eps,
                      .weight_decay = optimizer.weight_decay,
                      .grad_clip = optimizer.grad_clip,
                      .warmup_steps = optimizer.warmup_steps,
                      .schedule = optimizer.schedule,
                      .lr_decay_steps = optimizer.lr_decay_steps,
                      .min_lr = optimizer.min_lr};
}

ReferenceAdamW::ReferenceAdamW(const ParameterStore& params, AdamWOptions options)
    : options_(options) {
  for (std::size_t u = 0; u < params.units().size(); ++u) {
    exp_avg_.emplace_back(params.unit(u).size(), 0.0f);
    exp_avg_sq_.emplace_back(params.unit(u).size(), 0.0f);
  }
}

double ReferenceAdamW::step(ParameterStore& params, ParameterStore& grads) {
  STRATA_ASSERT(grads.units().size() == exp_avg_.size());
  double sum_sq = 0.0;
  for (std::size_t u = 0; u < exp_avg_.size(); ++u) {
    for (const float g : grads.unit(u)) {
      sum_sq += static_cast<double>(g) * g;
    }
  }
  const double norm = std::sqrt(sum_sq);
  const double clip =
      options_.grad_clip > 0.0 && norm > options_.grad_clip ? options_.grad_clip / norm : 1.0;
  ++steps_;
  const double lr = runtime::scheduled_lr(schedule_of(options_), steps_);
  const double correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(steps_));
  const double correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(steps_));
  for (std::size_t u = 0; u < exp_avg_.size(); ++u) {
    const std::vector<std::span<float>> p = params.mutable_views(u);
    const std::vector<std::span<float>> g = grads.mutable_views(u);
    for (std::size_t t = 0; t < p.size(); ++t) {
      const TensorSpec& spec = params.units()[u].tensors[t];
      const double decay = spec.weight_decay ? options_.weight_decay : 0.0;
      float* m = exp_avg_[u].data() + spec.offset;
      float* v = exp_avg_sq_[u].data() + spec.offset;
      for (std::size_t i = 0; i < p[t].size(); ++i) {
        const double grad = static_cast<double>(g[t][i]) * clip;
        g[t][i] = static_cast<float>(grad);
        m[i] = static_cast<float>(options_.beta1 * m[i] + (1.0 - options_.beta1) * grad);
        v[i] = static_cast<float>(options_.beta2 * v[i] + (1.0 - options_.beta2) * grad * grad);
        const double update = (m[i] / correction1) / (std::sqrt(v[i] / correction2) + options_.eps);
        const double value = p[t][i] * (1.0 - lr * decay) - lr * update;
        p[t][i] = static_cast<float>(value);
      }
    }
  }
  return norm;
}

}  // namespace strata::gpt
