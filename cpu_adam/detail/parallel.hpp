// Runs a [begin, end) range function over fixed-size chunks inside the caller's task arena.
#pragma once

#include <cstddef>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "base/assert.hpp"
#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/exec_options.hpp"

namespace strata::cpu_adam::detail {

inline const KernelTable& kernels_for(const ExecOptions& options) {
  return kernels_for(options.simd_level.value_or(best_simd_level()));
}

// Chunk c covers [c * chunk_elems, min(count, (c + 1) * chunk_elems)). Element-wise kernels give
// the same bits whatever the chunking, so TBB is free to schedule chunks as it likes.
template <class RangeFn>
void for_each_chunk(tbb::task_arena& arena, std::size_t count, std::size_t chunk_elems,
                    const RangeFn& fn) {
  STRATA_ASSERT(chunk_elems > 0);
  if (count == 0) return;
  if (count <= chunk_elems) {
    fn(std::size_t{0}, count);
    return;
  }
  const std::size_t chunks = (count + chunk_elems - 1) / chunk_elems;
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks),
                      [&](const tbb::blocked_range<std::size_t>& range) {
                        const std::size_t begin = range.begin() * chunk_elems;
                        const std::size_t end =
                            range.end() * chunk_elems < count ? range.end() * chunk_elems : count;
                        fn(begin, end);
                      });
  });
}

}  // namespace strata::cpu_adam::detail
