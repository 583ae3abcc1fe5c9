// The optimizer ops on HostDevice: cpu_adam's own kernels on the op's (host) addresses, spread over
// the device's task arena from the stream's worker thread. They define the bits the CUDA kernels
// must reproduce.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include "tiers/device/device_op.hpp"

namespace strata::tiers::detail {

void run_on_host(const OptimizerOp& op, tbb::task_arena& arena);
void run_on_host(const SumOfSquaresOp& op, tbb::task_arena& arena);

}  // namespace strata::tiers::detail
