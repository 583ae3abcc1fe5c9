// The device kernels as plain host loops: HostDevice runs them on its stream threads. They use the
// same scalar conversions as the CUDA kernels, so both backends give the same bits.
#pragma once

#include "tiers/device/device_op.hpp"

namespace strata::tiers::detail {

void run_on_host(const CopyOp& op);
void run_on_host(const CastOp& op);
void run_on_host(const ScaleOp& op);
void run_on_host(const FillOp& op);
void run_on_host(const FillBytesOp& op);
void run_on_host(const AccumulateOp& op);
void run_on_host(const HostCallbackOp& op);

}  // namespace strata::tiers::detail
