// The device kernels: grid-stride loops over the same scalar conversions the host uses
// (base/float16.hpp), so HostDevice and CudaDevice give identical bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tiers/device/cuda_kernels.hpp"
#include "base/float16.hpp"

namespace strata::tiers::detail {

namespace {

constexpr unsigned kThreadsPerBlock = 256;
constexpr std::uint64_t kMaxBlocks = 4096;  // grid-stride beyond: enough to fill any current GPU

unsigned block_count(std::uint64_t count) {
  const std::uint64_t needed = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(std::max<std::uint64_t>(1, std::min(needed, kMaxBlocks)));
}

__device__ std::uint64_t first_index() {
  return static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ std::uint64_t grid_stride() {
  return static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
}

__global__ void fp32_to_bf16_kernel(const float* src, std::uint16_t* dst, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride())
    dst[i] = to_bf16(src[i]).bits;
}

__global__ void fp32_to_fp16_kernel(const float* src, std::uint16_t* dst, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride())
    dst[i] = to_fp16(src[i]).bits;
}

__global__ void bf16_to_fp32_kernel(const std::uint16_t* src, float* dst, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride())
    dst[i] = to_float(Bf16{src[i]});
}

__global__ void fp16_to_fp32_kernel(const std::uint16_t* src, float* dst, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride())
    dst[i] = to_float(Fp16{src[i]});
}

__global__ void scale_kernel(float* data, std::uint64_t count, float factor) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride()) data[i] *= factor;
}

__global__ void fill_kernel(float* data, std::uint64_t count, float value) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride()) data[i] = value;
}

__global__ void accumulate_fp32_kernel(float* dst, const float* src, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride()) dst[i] += src[i];
}

__global__ void accumulate_bf16_kernel(float* dst, const std::uint16_t* src, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride())
    dst[i] += to_float(Bf16{src[i]});
}

__global__ void accumulate_fp16_kernel(float* dst, const std::uint16_t* src, std::uint64_t count) {
  for (std::uint64_t i = first_index(); i < count; i += grid_stride())
    dst[i] += to_float(Fp16{src[i]});
}

}  // namespace

cudaError_t launch_cast(const CastOp& op, cudaStream_t stream) {
  if (op.count == 0) return cudaSuccess;
  const unsigned blocks = block_count(op.count);
  if (op.src_type == op.dst_type) {
    return cudaMemcpyAsync(op.dst, op.src, op.count * dtype_bytes(op.src_type),
                           cudaMemcpyDeviceToDevice, stream);
  }
  const auto* src16 = static_cast<const std::uint16_t*>(op.src);
  auto* dst16 = static_cast<std::uint16_t*>(op.dst);
  const auto* src32 = static_cast<const float*>(op.src);
  auto* dst32 = static_cast<float*>(op.dst);
  if (op.src_type == DType::kFp32 && op.dst_type == DType::kBf16) {
    fp32_to_bf16_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(src32, dst16, op.count);
  } else if (op.src_type == DType::kFp32 && op.dst_type == DType::kFp16) {
    fp32_to_fp16_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(src32, dst16, op.count);
  } else if (op.src_type == DType::kBf16 && op.dst_type == DType::kFp32) {
    bf16_to_fp32_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(src16, dst32, op.count);
  } else if (op.src_type == DType::kFp16 && op.dst_type == DType::kFp32) {
    fp16_to_fp32_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(src16, dst32, op.count);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_scale(const ScaleOp& op, cudaStream_t stream) {
  if (op.count == 0) return cudaSuccess;
  scale_kernel<<<block_count(op.count), kThreadsPerBlock, 0, stream>>>(op.data, op.count,
                                                                       op.factor);
  return cudaGetLastError();
}

cudaError_t launch_fill(const FillOp& op, cudaStream_t stream) {
  if (op.count == 0) return cudaSuccess;
  fill_kernel<<<block_count(op.count), kThreadsPerBlock, 0, stream>>>(op.data, op.count, op.value);
  return cudaGetLastError();
}

cudaError_t launch_accumulate(const AccumulateOp& op, cudaStream_t stream) {
  if (op.count == 0) return cudaSuccess;
  const unsigned blocks = block_count(op.count);
  switch (op.src_type) {
    case DType::kFp32:
      accumulate_fp32_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
          op.dst, static_cast<const float*>(op.src), op.count);
      break;
    case DType::kBf16:
      accumulate_bf16_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
          op.dst, static_cast<const std::uint16_t*>(op.src), op.count);
      break;
    case DType::kFp16:
      accumulate_fp16_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
          op.dst, static_cast<const std::uint16_t*>(op.src), op.count);
      break;
    case DType::kUint8:
    case DType::kUint64:
      return cudaErrorInvalidValue;  // Stream::accumulate asserts fp32, bf16 or fp16 first
  }
  return cudaGetLastError();
}

}  // namespace strata::tiers::detail
