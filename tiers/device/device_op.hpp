// The work a stream runs, as plain values: copies and kernels are described here and handed to a
// backend (HostDevice's worker thread, or CUDA calls), so both run the same runtime code.
// Pointers are raw addresses: device addresses for the device side, host addresses for the host
// side. Counts are elements; bytes are bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <variant>

#include "base/dtype.hpp"

namespace strata::tiers {

enum class CopyDirection { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct CopyOp {
  CopyDirection direction;
  void* dst;
  const void* src;
  std::uint64_t bytes;
};

// dst[i] = convert(src[i]); supported pairs: fp32 -> bf16/fp16 (round to nearest even),
// bf16/fp16 -> fp32 (exact), and any type to itself (a copy).
struct CastOp {
  void* dst;
  DType dst_type;
  const void* src;
  DType src_type;
  std::uint64_t count;
};

// data[i] *= factor (fp32).
struct ScaleOp {
  float* data;
  std::uint64_t count;
  float factor;
};

// data[i] = value (fp32).
struct FillOp {
  float* data;
  std::uint64_t count;
  float value;
};

// Every byte of data = value.
struct FillBytesOp {
  void* data;
  std::uint64_t bytes;
  std::uint8_t value;
};

// dst[i] += float(src[i]) with src in fp32, bf16 or fp16 (gradient accumulation in fp32).
struct AccumulateOp {
  float* dst;
  const void* src;
  DType src_type;
  std::uint64_t count;
};

// A host function run in stream order (like cudaLaunchHostFunc). It must not enqueue work on any
// stream of the device and must not wait on the device. An exception it throws is the stream's
// error, rethrown by the next Stream::synchronize().
struct HostCallbackOp {
  std::function<void()> function;
};

using DeviceOp =
    std::variant<CopyOp, CastOp, ScaleOp, FillOp, FillBytesOp, AccumulateOp, HostCallbackOp>;

}  // namespace strata::tiers
