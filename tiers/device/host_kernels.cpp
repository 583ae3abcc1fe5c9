// Host loops for the device kernels. Written as simple index loops over restrict-free typed
// pointers; the compiler vectorises the fp32 ones, the 16-bit conversions stay scalar and branchy
// (a HostDevice is for correctness and scheduling, not peak cast throughput).
#include "tiers/device/host_kernels.hpp"

#include <algorithm>
#include <cstring>

#include "base/assert.hpp"
#include "tiers/device/detail/half_convert.hpp"

namespace strata::tiers::detail {

namespace {

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
  if (op.src_type == DType::kFloat32) {
    if (op.dst_type == DType::kBFloat16) {
      convert_from_fp32(op, fp32_to_bf16);
    } else {
      convert_from_fp32(op, fp32_to_fp16);
    }
    return;
  }
  STRATA_ASSERT(op.dst_type == DType::kFloat32, "unsupported cast");
  if (op.src_type == DType::kBFloat16) {
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
    case DType::kFloat32: {
      const auto* src = static_cast<const float*>(op.src);
      for (std::uint64_t i = 0; i < op.count; ++i) {
        op.dst[i] += src[i];
      }
      return;
    }
    case DType::kBFloat16:
      accumulate_16(op, bf16_to_fp32);
      return;
    case DType::kFloat16:
      accumulate_16(op, fp16_to_fp32);
      return;
  }
}

void run_on_host(const HostCallbackOp& op) {
  op.function();
}

}  // namespace strata::tiers::detail
