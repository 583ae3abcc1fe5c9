// Launchers for the device kernels (cuda_kernels.cu). Each enqueues one kernel on the stream and
// returns cudaGetLastError() of the launch. Private to cuda_device.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include "tiers/device/device_op.hpp"

namespace strata::tiers::detail {

cudaError_t launch_cast(const CastOp& op, cudaStream_t stream);
cudaError_t launch_scale(const ScaleOp& op, cudaStream_t stream);
cudaError_t launch_fill(const FillOp& op, cudaStream_t stream);
cudaError_t launch_accumulate(const AccumulateOp& op, cudaStream_t stream);

}  // namespace strata::tiers::detail
