// Device memory a model's CUDA backend allocates (cuda_backend.hpp's allocate<T>), counted without
// a GPU, so the memory plan can charge the device tier for the model's compute before anything is
// allocated. Each backend's constructor asserts that it allocated exactly what its count says.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "base/units.hpp"
#include "tiers/device/device.hpp"

namespace strata::examples {

struct DeviceBytes {
  std::uint64_t allocated = 0;  // CudaBackend::allocated_bytes(): the elements' bytes
  std::uint64_t budgeted = 0;   // what the tiers::Device's budget is charged for them

  template <typename T>
  void add(std::size_t count) {
    allocated += count * sizeof(T);
    budgeted += round_up(std::max<std::size_t>(1, count) * sizeof(T),
                         tiers::kDeviceAllocationGranularity);
  }
  DeviceBytes& operator+=(const DeviceBytes& other) {
    allocated += other.allocated;
    budgeted += other.budgeted;
    return *this;
  }
};

}  // namespace strata::examples
