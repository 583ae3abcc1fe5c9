// `strata bench device`'s optimizer rows: the fused device optimizer step
// (Stream::optimizer_update) and the device sum of squares over one flat sub-group, timed on the
// device's own stream.
#pragma once

#include <chrono>
#include <cstdint>

#include "tiers/device/device.hpp"

namespace strata::cli {

// Wall seconds per call of `body` over `iterations` calls, after one warm-up call (first touch,
// page faults, occupancy queries, kernel JIT). The caller's body waits for its own work.
template <typename Body>
double seconds_per_iteration(int iterations, Body body) {
  body();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) body();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / iterations;
}

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
