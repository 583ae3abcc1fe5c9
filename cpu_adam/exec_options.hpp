// How a cpu_adam call runs: which SIMD level and how the work is cut into chunks. The thread
// count is not here: it is the size of the tbb::task_arena the caller passes (the config's
// optimizer threads). Results never depend on any of these (see docs/cpu_adam.md).
#pragma once

#include <cstddef>
#include <optional>

#include "cpu_adam/simd_level.hpp"

namespace strata::cpu_adam {

// 16 Ki elements: 64 KiB per fp32 array, so one chunk's ~4 streams fit in L2 while the next
// chunk's lines are fetched, and ~6k tasks per 100 M parameters keep every thread busy.
inline constexpr std::size_t kDefaultChunkElems = 16 * 1024;

struct ExecOptions {
  std::optional<SimdLevel> simd_level;           // empty: best_simd_level(); set: must be available
  std::size_t chunk_elems = kDefaultChunkElems;  // elements per parallel task (>= 1)
};

}  // namespace strata::cpu_adam
