// The one mapping between each pair of element-type enums the Engine crosses: the config's
// precision (DType) to the CPU optimizer's Dtype, and that Dtype to the device kernels' and the
// communicators' types. The enums stay separate (each library owns its own); only the conversions
// live here.
#pragma once

#include "cpu_adam/dtype.hpp"
#include "runtime/comm/dtype.hpp"
#include "runtime/config.hpp"
#include "tiers/device/dtype.hpp"

namespace strata::runtime {

constexpr cpu_adam::Dtype to_cpu_adam_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return cpu_adam::Dtype::kFp32;
    case DType::kBf16:
      return cpu_adam::Dtype::kBf16;
    case DType::kFp16:
      return cpu_adam::Dtype::kFp16;
  }
  return cpu_adam::Dtype::kFp32;
}

constexpr tiers::DType to_device_dtype(cpu_adam::Dtype dtype) {
  switch (dtype) {
    case cpu_adam::Dtype::kFp32:
      return tiers::DType::kFloat32;
    case cpu_adam::Dtype::kBf16:
      return tiers::DType::kBFloat16;
    case cpu_adam::Dtype::kFp16:
      return tiers::DType::kFloat16;
  }
  return tiers::DType::kFloat32;
}

constexpr comm::DataType to_comm_dtype(cpu_adam::Dtype dtype) {
  switch (dtype) {
    case cpu_adam::Dtype::kFp32:
      return comm::DataType::kFp32;
    case cpu_adam::Dtype::kBf16:
      return comm::DataType::kBf16;
    case cpu_adam::Dtype::kFp16:
      return comm::DataType::kFp16;
  }
  return comm::DataType::kFp32;
}

}  // namespace strata::runtime
