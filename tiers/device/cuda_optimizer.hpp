// Launchers of the CUDA optimizer (cuda_optimizer.cu) and of the gradient norm
// (cuda_grad_norm.cu). Each enqueues its kernels on the stream and returns the launch's
// cudaGetLastError(). Private to cuda_device.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "tiers/device/device_op.hpp"

namespace strata::tiers::detail {

// One kernel launch for the whole sub-group.
cudaError_t launch_optimizer(const OptimizerOp& op, cudaStream_t stream);

// Two launches: per-block sums into op.block_sums, then the fixed tree into *op.sum.
cudaError_t launch_sum_of_squares(const SumOfSquaresOp& op, cudaStream_t stream);

}  // namespace strata::tiers::detail
