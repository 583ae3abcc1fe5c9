// What step() and step_compressed() share: which arrays a rule keeps, its kernel-table indices and
// the per-step constants (defined in optimizer.cpp).
#pragma once

#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/optimizer.hpp"

namespace strata::cpu_adam::detail {

bool uses_exp_avg(Algorithm algorithm);
bool uses_exp_avg_sq(Algorithm algorithm);
UpdateRule rule_of(Algorithm algorithm);
int out_index(const TypedSpan& param_out);
// Everything per step computed in double and rounded to fp32 once.
UpdateConstants make_constants(const Hyperparams& hyperparams, const GradScaling& scaling);

}  // namespace strata::cpu_adam::detail
