// `strata bench device`'s optimizer rows: the fused device optimizer step
// (Stream::optimizer_update) and the device sum of squares over one flat sub-group, timed on the
// device's own stream.
#pragma once

#include <cstdint>

#include "tiers/device/device.hpp"

namespace strata::cli {

struct DeviceOptimizerFigures {
  std::uint64_t params = 0;
  double update_s = 0;          // one AdamW step: fp32 master and moments, bf16 grads and params
  double update_bytes = 0;      // what it must move: cpu_adam::bytes_per_element per parameter
  double sum_of_squares_s = 0;  // the bf16 gradients' sum of squares
  double sum_of_squares_bytes = 0;
};

// Device memory it needs: the state, the gradients, the new parameters and the norm's scratch.
std::uint64_t device_optimizer_bytes(std::uint64_t params);

// Seconds per iteration (after one warm-up) of each, on `device`.
DeviceOptimizerFigures measure_device_optimizer(tiers::Device& device, std::uint64_t params,
                                                int iterations);

}  // namespace strata::cli
