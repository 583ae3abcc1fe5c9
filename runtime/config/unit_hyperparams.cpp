#include "runtime/config/unit_hyperparams.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "runtime/config/lr_schedule.hpp"

namespace strata::runtime {
namespace {

void check(bool ok, std::string_view where, std::string_view field, double value,
           std::string_view rule) {
  if (ok) return;
  throw std::invalid_argument(fmt::format("{}: {} = {} {}", where, field, value, rule));
}

}  // namespace

void validate_peak_lr(double lr, const OptimizerConfig& optimizer, std::string_view where) {
  check(std::isfinite(lr) && lr >= 0, where, "lr", lr, "is not finite and >= 0");
  if (optimizer.schedule != LrScheduleKind::kConstant) {
    check(lr >= optimizer.min_lr, where, "lr", lr,
          fmt::format("is below [optimizer] min_lr = {} of the {} schedule", optimizer.min_lr,
                      to_string(optimizer.schedule)));
  }
}

void validate_unit_hyperparams(const UnitHyperparams& hyper, const OptimizerConfig& optimizer,
                               std::string_view unit_name) {
  const std::string where = fmt::format("set_unit_hyperparams: unit '{}'", unit_name);
  if (hyper.lr) validate_peak_lr(*hyper.lr, optimizer, where);
  if (hyper.weight_decay) {
    check(std::isfinite(*hyper.weight_decay) && *hyper.weight_decay >= 0, where, "weight_decay",
          *hyper.weight_decay, "is not finite and >= 0");
  }
  if (hyper.beta1) {
    check(*hyper.beta1 >= 0 && *hyper.beta1 < 1, where, "beta1", *hyper.beta1, "is not in [0, 1)");
  }
  if (hyper.beta2) {
    check(*hyper.beta2 >= 0 && *hyper.beta2 < 1, where, "beta2", *hyper.beta2, "is not in [0, 1)");
  }
  if (hyper.eps) {
    check(std::isfinite(*hyper.eps) && *hyper.eps >= 0, where, "eps", *hyper.eps,
          "is not finite and >= 0");
  }
}

cpu_adam::Hyperparams unit_step_hyperparams(const cpu_adam::Hyperparams& global,
                                            const UnitHyperparams& hyper,
                                            const OptimizerConfig& optimizer, std::uint64_t step) {
  cpu_adam::Hyperparams result = global;
  if (hyper.lr) {
    OptimizerConfig unit_optimizer = optimizer;
    unit_optimizer.lr = *hyper.lr;
    result.lr = scheduled_lr(unit_optimizer, step);
  }
  if (hyper.weight_decay) result.weight_decay = *hyper.weight_decay;
  if (hyper.beta1) result.beta1 = *hyper.beta1;
  if (hyper.beta2) result.beta2 = *hyper.beta2;
  if (hyper.eps) result.eps = *hyper.eps;
  return result;
}

}  // namespace strata::runtime
