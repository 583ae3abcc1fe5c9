// Compatibility only: removed once the Engine files (runtime/engine.cpp, runtime/engine_device.cpp)
// adopt strata::DType (base/dtype.hpp). The config's precision, the CPU optimizer, the device
// kernels and the communicators all take that one type now, so every conversion here is the
// identity, and tiers::DType::kFloat32 & co. name DType's values.
#pragma once

// Every tiers header that names DType is parsed before the shim below declares tiers::DType.
#include "base/dtype.hpp"
#include "cpu_adam/dtype.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/config.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {

struct DType {
  static constexpr strata::DType kFloat32 = strata::DType::kFp32;
  static constexpr strata::DType kBFloat16 = strata::DType::kBf16;
  static constexpr strata::DType kFloat16 = strata::DType::kFp16;
};

}  // namespace strata::tiers

namespace strata::runtime {

constexpr strata::DType to_cpu_adam_dtype(strata::DType dtype) {
  return dtype;
}

constexpr strata::DType to_device_dtype(strata::DType dtype) {
  return dtype;
}

constexpr strata::DType to_comm_dtype(strata::DType dtype) {
  return dtype;
}

}  // namespace strata::runtime
