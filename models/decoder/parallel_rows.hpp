// parallel_rows: element-wise and per-row work split over oneTBB. Each chunk writes disjoint
// outputs and every row's arithmetic is the same whichever thread runs it, so results never
// depend on the thread count or on how the range is split.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cstddef>

namespace strata::llm::detail {

template <typename Body>
void parallel_rows(std::size_t count, std::size_t grain, const Body& body) {
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, count, grain),
                    [&](const tbb::blocked_range<std::size_t>& range) {
                      for (std::size_t i = range.begin(); i < range.end(); ++i) body(i);
                    });
}

}  // namespace strata::llm::detail
