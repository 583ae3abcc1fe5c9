// Host loops for the device kernels. Written as simple index loops over restrict-free typed
// pointers; the conversions are base/float16.hpp's, the same the CUDA kernels run, so HostDevice
// and CudaDevice give identical bits (a HostDevice is for correctness and scheduling, not peak cast
// throughput).
#include "tiers/device/host_kernels.hpp"

#include <algorithm>
#include <cstring>

#include "base/assert.hpp"
#include "base/float16.hpp"

namespace strata::tiers::detail {

namespace {

std::uint16_t fp32_to_bf16(float value) {
  return to_bf16(value).bits;
}
std::uint16_t fp32_to_fp16(float value) {
  return to_fp16(value).bits;
}
float bf16_to_fp32(std::uint16_t bits) {
  return to_float(Bf16{bits});
}
float fp16_to_fp32(std::uint16_t bits) {
  return to_float(Fp16{bits});
}

template <typename Convert>
void convert_from_fp32(const CastOp& op, Convert convert) {
  const auto* src = static_cast<const float*>(op.src);
  auto* dst = static_cast<std::uint16_t*>(op.dst);
  for (std::uint64_t i = 0; i < op.count; ++i) {
    dst[i] = convert(src[i]);
  }
}

template <typename Convert>
void convert_to_fp32(const CastOp& op, Convert convert) {
  const auto* src = static_cast<const std::uint16_t*>(op.src);
  auto* dst = static_cast<float*>(op.dst);
  for (std::uint64_t i = 0; i < op.count; ++i) {
    dst[i] = convert(src[i]);
  }
}

template <typename Convert>
void accumulate_16(const AccumulateOp& op, Convert convert) {
  const auto* src = static_cast<const std::uint16_t*>(op.src);
  for (std::uint64_t i = 0; i < op.count; ++i) {
    op.dst[i] += convert(src[i]);
  }
}

}  // namespace

void run_on_host(const CopyOp& op) {
  if (op.bytes != 0) {
    std::memmove(op.dst, op.src, op.bytes);  // device-to-device copies may overlap
  }
}

void run_on_host(const CastOp& op) {
  if (op.src_type == op.dst_type) {
    if (op.count != 0) {
      std::memmove(op.dst, op.src, op.count * dtype_bytes(op.src_type));
    }
    return;
  }
  if (op.src_type == DType::kFp32) {
    if (op.dst_type == DType::kBf16) {
      convert_from_fp32(op, fp32_to_bf16);
    } else {
      convert_from_fp32(op, fp32_to_fp16);
    }
    return;
  }
  STRATA_ASSERT(op.dst_type == DType::kFp32, "unsupported cast");
  if (op.src_type == DType::kBf16) {
    convert_to_fp32(op, bf16_to_fp32);
  } else {
    convert_to_fp32(op, fp16_to_fp32);
  }
}

void run_on_host(const ScaleOp& op) {
  for (std::uint64_t i = 0; i < op.count; ++i) {
    op.data[i] *= op.factor;
  }
}

void run_on_host(const FillOp& op) {
  std::fill_n(op.data, op.count, op.value);
}

void run_on_host(const FillBytesOp& op) {
  if (op.bytes != 0) {
    std::memset(op.data, op.value, op.bytes);
  }
}

void run_on_host(const AccumulateOp& op) {
  switch (op.src_type) {
    case DType::kFp32: {
      const auto* src = static_cast<const float*>(op.src);
      for (std::uint64_t i = 0; i < op.count; ++i) {
        op.dst[i] += src[i];
      }
      return;
    }
    case DType::kBf16:
      accumulate_16(op, bf16_to_fp32);
      return;
    case DType::kFp16:
      accumulate_16(op, fp16_to_fp32);
      return;
    case DType::kUint8:
    case DType::kUint64:
      break;
  }
  STRATA_ASSERT(false, "accumulate takes fp32, bf16 or fp16");
}

void run_on_host(const HostCallbackOp& op) {
  op.function();
}

}  // namespace strata::tiers::detail
