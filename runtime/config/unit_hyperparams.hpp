// Per-unit optimizer hyper-parameters: a unit may override [optimizer] lr, beta1, beta2, eps and
// weight_decay (PyTorch's param groups map onto this). Unset fields take the config's value.
//
// The learning-rate rule: a unit's `lr` replaces [optimizer] lr as the peak rate of the schedule,
// so the warm-up and decay scale it exactly as they scale the global rate:
//   unit rate at step s = scheduled_lr([optimizer] with lr := unit lr, s)  (lr_schedule.hpp)
// With no schedule (the default, constant) the unit's rate is its lr. Under a decaying schedule the
// unit's lr must be >= min_lr (decay then ends at min_lr for every unit).
//
// Weight decay still applies only to tensors whose TensorSpec::weight_decay is set; a unit's
// weight_decay replaces the config's value for those tensors.
//
// Overrides are not written to checkpoints: after Engine::load or a resume the caller re-applies
// them (strata.torch.OffloadOptimizer does so from its param_groups every step).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "cpu_adam/optimizer.hpp"
#include "runtime/config/config.hpp"

namespace strata::runtime {

struct UnitHyperparams {
  std::optional<double> lr;            // finite, >= 0 (>= min_lr under a decaying schedule)
  std::optional<double> weight_decay;  // finite, >= 0
  std::optional<double> beta1;         // [0, 1)
  std::optional<double> beta2;         // [0, 1)
  std::optional<double> eps;           // finite, >= 0

  bool any() const { return lr || weight_decay || beta1 || beta2 || eps; }
  bool operator==(const UnitHyperparams&) const = default;
};

// Throws std::invalid_argument unless `lr` may be the peak rate of `optimizer`'s schedule: finite,
// >= 0 and, under a decaying schedule, >= min_lr. The one rule for Engine::set_learning_rate and a
// unit's lr; `where` starts the message ("set_learning_rate", "set_unit_hyperparams: unit 'x'").
void validate_peak_lr(double lr, const OptimizerConfig& optimizer, std::string_view where);

// Throws std::invalid_argument naming `unit_name` and the field for a value out of range.
void validate_unit_hyperparams(const UnitHyperparams& hyper, const OptimizerConfig& optimizer,
                               std::string_view unit_name);

// The hyper-parameters of a unit's update at `step` (1-based): `global` (built from the config
// with the scheduled global rate) with the unit's overrides applied. Returns `global` unchanged,
// bit for bit, when the unit overrides nothing.
cpu_adam::Hyperparams unit_step_hyperparams(const cpu_adam::Hyperparams& global,
                                            const UnitHyperparams& hyper,
                                            const OptimizerConfig& optimizer, std::uint64_t step);

}  // namespace strata::runtime
