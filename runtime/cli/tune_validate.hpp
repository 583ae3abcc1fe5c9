// `strata tune --validate`: the tuned config's optimizer step, timed with `strata bench step`'s
// machinery (step_runner.hpp) over `params` synthetic parameters on the host device, next to its
// prediction, and the same for a small grid of hand configs measured in the same run. The configs
// are timed alternately over `rounds` rounds (each round every config once, in an order that
// changes each round: runtime/tune/validation.hpp), so a slow spell of the machine falls on all of
// them; the table prints each config's median over the rounds and its min..max spread, then two
// verdicts on the tuned config's figures (pooled over its own row and any neighbour row equal to
// it): its median within 15% of its prediction, and its median against the best hand config's,
// where a difference smaller than the larger spread is "within noise". Printed figures, not a
// test: they depend on the machine and its load.
#pragma once

#include <cstdint>

#include "runtime/config/config.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::cli {

// `params` synthetic parameters in units of `model_unit_params` (the model's largest unit);
// `rounds` >= 1.
void validate_choice(const runtime::Config& given, const runtime::Config& tuned,
                     const runtime::tune::MachineProfile& profile, std::uint64_t params,
                     std::uint64_t model_unit_params, std::uint32_t rounds);

}  // namespace strata::cli
