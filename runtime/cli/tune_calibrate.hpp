// `strata tune`'s calibration of what bytes and rates do not show: the cost of each optimizer
// sub-group beyond its bytes (the hand-offs between the optimizer thread, the I/O rings and the
// checksum thread, a wake-up each on a loaded machine). Two real optimizer steps of the Engine
// over the same synthetic state, in few large and many small sub-groups, against the cost model's
// prediction of each: the residual that grows with the sub-group count, per sub-group.
#pragma once

#include <ostream>

#include "runtime/config/config.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::cli {

// Seconds per sub-group (>= 0) for `config`'s NVMe paths and knobs, on the host device; sets
// profile.sub_group_overhead_s to it. Nothing to calibrate (0) without NVMe paths or drives
// measured, or when the Engine cannot run there (a drive too small or full: the line says why).
// One line of figures goes to `log`.
double calibrate_sub_group_overhead(const runtime::Config& config,
                                    runtime::tune::MachineProfile& profile, std::ostream& log);

// The I/O point of the grid the Engine's own optimizer step runs fastest with. The probe's raw
// reads and writes can rank queue depths otherwise than the pipeline does (on the development
// VM the probe put depth 64 ahead of 16 while every Engine step ran faster at 16). Times real
// steps of `chosen` (its placement and knobs) over min(params, 16 Mi, what a fifth of budget_s
// affords at the probe's best rate; at least 1 Mi) parameters in units of unit_params, at each
// grid point whose mixed rate is at least half the best (four at most), alternately over three
// rounds, sets profile.engine_io_point to the lowest median and profile.engine_io_scale to the
// factor on the probe's mixed rates at which the model predicts the step measured there (1 when
// no factor within 1/8..8 does). Leaves
// the profile as it was with fewer than two such points, without NVMe, or when the Engine
// cannot run there (the line says why). One line per point goes to `log`.
void choose_io_point_on_engine(const runtime::Config& chosen,
                               runtime::tune::MachineProfile& profile, std::uint64_t params,
                               std::uint64_t unit_params, double budget_s, std::ostream& log);

}  // namespace strata::cli
