// --steps is a run's total, not a count from the resume point: the same command line restarted
// after a crash ends at the same step, with the same schedule end, as the uninterrupted run.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace strata::examples {

// The step a run of `total_steps` ends at, resumed at `committed_step` (never before it).
inline std::uint64_t run_end_step(std::uint64_t committed_step, std::uint64_t total_steps) {
  return committed_step > total_steps ? committed_step : total_steps;
}

// What a resumed run will do, for the log: "" on a fresh start.
inline std::string resume_note(std::uint64_t committed_step, std::uint64_t total_steps) {
  if (committed_step == 0) return "";
  if (committed_step >= total_steps) {
    return fmt::format(
        "  resumed at step {} from the NVMe store: the run (--steps {}) is already complete, "
        "nothing to train\n",
        committed_step, total_steps);
  }
  return fmt::format("  resumed at step {} from the NVMe store: {} steps left to reach --steps {}\n",
                     committed_step, total_steps - committed_step, total_steps);
}

}  // namespace strata::examples
