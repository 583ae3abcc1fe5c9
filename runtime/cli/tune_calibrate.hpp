// `strata tune`'s calibration of what bytes and rates do not show: the cost of each optimizer
// sub-group beyond its bytes (the hand-offs between the optimizer thread, the I/O rings and the
// checksum thread, a wake-up each on a loaded machine). Two real optimizer steps of the Engine
// over the same synthetic state, in few large and many small sub-groups, against the cost model's
// prediction of each: the residual that grows with the sub-group count, per sub-group.
#pragma once

#include <ostream>

#include "runtime/config.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::cli {

// Seconds per sub-group (>= 0) for `config`'s NVMe paths and knobs, on the host device; sets
// profile.sub_group_overhead_s to it. Nothing to calibrate (0) without NVMe paths or drives
// measured, or when the Engine cannot run there (a drive too small or full: the line says why).
// One line of figures goes to `log`.
double calibrate_sub_group_overhead(const runtime::Config& config,
                                    runtime::tune::MachineProfile& profile, std::ostream& log);

}  // namespace strata::cli
