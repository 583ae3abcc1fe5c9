// The choice `strata tune` makes from a MachineProfile: the NVMe knobs (block size, queue depth,
// rings) at the best measured mixed bandwidth, the optimizer threads at the best Adam rate, then
// the placement (params, grads, optimizer homes), sub_group_size, buffer_count and prefetch_depth
// that minimise the predicted step time (cost_model.hpp) among those whose memory plan fits every
// budget. Deterministic: candidates are tried in a fixed order and only a strictly faster one
// replaces the one kept, so ties go to the earlier (higher tier, larger sub-group, more buffers).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config/config.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/tune/cost_model.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::runtime::tune {

struct TuneChoice {
  Config config;              // the base config with the chosen knobs
  StepPrediction prediction;  // of `config`
  std::uint64_t candidates = 0;  // configs predicted
  std::uint64_t fitting = 0;     // of which fit every budget
  // Why each knob has its value, keyed by the config key ("tiers.nvme.block_size").
  std::vector<std::pair<std::string, std::string>> reasons;
};

// The IoPoint with the highest mixed bandwidth; within 2% of it, or within the grid's noise
// (MachineProfile::io_noise) when that is larger, the one with the fewest bytes in flight (less
// pinned memory, fewer threads, and on a noisy probe no choice made on noise); the point the
// Engine's own step ran fastest with (MachineProfile::engine_io_point) when one was timed.
// nullopt when nothing was measured.
std::optional<IoPoint> choose_io_point(const MachineProfile& profile);

// The fewest threads whose rate of `update` is within 2% of that update's best (the rest stay free
// for the I/O threads and the device streams); 0 when the profile holds no point of `update`.
std::uint32_t choose_adam_threads(const MachineProfile& profile, const AdamUpdate& update);

// Searches the placements and knobs; nullopt when none fits the budgets (the base config's
// `strata plan` then says what would).
std::optional<TuneChoice> choose_config(const Config& base, const PlanInputs& inputs,
                                        const MachineProfile& profile);

}  // namespace strata::runtime::tune
