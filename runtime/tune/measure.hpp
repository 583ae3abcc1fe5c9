// The measurements of `strata tune`, each within its share of one time budget: the NVMe grid
// (io_probe.hpp, over the config's paths striped, then each path alone when there are several),
// host memory bandwidth (parallel memcpy), CPU Adam per thread count (cpu_adam::step over state
// in memory) and pinned host <-> GPU copies when a CUDA device is present. The grid is scaled
// down to fit its share: first the bytes per point, then the number of points; a phase that runs
// past its deadline stops and says so.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::runtime::tune {

struct MeasureOptions {
  double budget_s = 120;
  // [tiers.nvme] paths, direct, engine, budget and [tiers.device] kind: what is measured.
  NvmeTierConfig nvme;
  DeviceKind device = DeviceKind::kAuto;
  std::ostream* log = nullptr;  // one line per phase; null: quiet
};

// Throws io::IoError when a path cannot be written.
MachineProfile measure_machine(const MeasureOptions& options);

}  // namespace strata::runtime::tune
