// `strata tune --validate`: the tuned config's optimizer step, timed with `strata bench step`'s
// machinery (step_runner.hpp) over `params` synthetic parameters on the host device, next to its
// prediction, and the same for a small grid of hand configs measured in the same run. A printed
// table, not a test: the figures depend on the machine and its load.
#pragma once

#include <cstdint>

#include "runtime/config.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::cli {

// `params` synthetic parameters in units of `model_unit_params` (the model's largest unit).
void validate_choice(const runtime::Config& given, const runtime::Config& tuned,
                     const runtime::tune::MachineProfile& profile, std::uint64_t params,
                     std::uint64_t model_unit_params);

}  // namespace strata::cli
