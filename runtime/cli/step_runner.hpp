// The optimizer steps `strata bench step` times, shared with `strata tune --validate`: one Engine
// over synthetic units with the state where the config puts it, steps alternating between the I/O
// pipeline alone and the real step, and CPU Adam over the same elements in memory.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"
#include "tiers/device/device.hpp"

namespace strata::cli {

struct Timings {
  std::vector<double> io_s;           // steps with the arithmetic off
  std::vector<double> step_s;         // real steps
  std::uint64_t step_nvme_bytes = 0;  // moved within one real step
};

double median(std::vector<double> values);

// One Engine over `params` parameters in units of `unit_params`; `steps` steps of each kind,
// alternating, so both see the same files and the same machine noise. [zero] overlap_optimizer
// and defer_update are turned off: the step runs every update itself, inside the time measured.
Timings run_steps(const runtime::Config& config, tiers::Device& device,
                  runtime::comm::Communicator& comm, std::uint64_t params,
                  std::uint64_t unit_params, std::uint32_t steps,
                  const runtime::EngineOptions& engine_options);

// `params` parameters cut into units of `unit_params` (the last one shorter): the unit sizes
// run_steps registers, for a plan or a prediction of the same Engine.
std::vector<std::uint64_t> unit_sizes(std::uint64_t params, std::uint64_t unit_params);

// `config` on the host device with each NVMe path replaced by the folder `name` under it
// (created): scratch stores for the steps `strata tune` times, so a training store in the paths
// is never touched. remove_scratch_stores removes those folders again.
runtime::Config in_scratch_stores(runtime::Config config, std::string_view name);
void remove_scratch_stores(const runtime::Config& scratch);

// run_steps on a fresh host device of the config's device budget, overwriting the store, after
// syncing the file systems (what earlier work left dirty is not these steps' to flush: the
// first config timed paid for it, 2x slower than the same config timed later).
Timings run_steps_on_host(const runtime::Config& config, runtime::comm::Communicator& comm,
                          std::uint64_t params, std::uint64_t unit_params, std::uint32_t steps);

// Seconds of `steps` passes of Adam over `params` elements in sub-groups held in memory, in the
// formats of [optimizer] master_dtype / state_dtype (the fused compressed update when not fp32).
double time_adam(const runtime::Config& config, std::uint64_t params, std::uint32_t steps);

}  // namespace strata::cli
