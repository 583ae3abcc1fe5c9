// The work a stream runs, as plain values: copies and kernels are described here and handed to a
// backend (HostDevice's worker thread, or CUDA calls), so both run the same runtime code.
// Pointers are raw addresses: device addresses for the device side, host addresses for the host
// side. Counts are elements; bytes are bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <variant>

#include "base/dtype.hpp"
#include "cpu_adam/state_dtype.hpp"
#include "cpu_adam/step_plan.hpp"

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

// One optimizer update of a sub-group whose state is in device memory: step_compressed()'s work
// (cpu_adam/compressed_step.hpp) on device addresses, the state updated in place and the new
// 16-bit parameters written in the same pass. HostDevice runs it with cpu_adam's own code, CUDA
// with one fused kernel (cuda_optimizer.cu) that gives the same bytes. plan comes from
// cpu_adam::plan_step (the step's hyper-parameters, scaling and rounding seed).
//  - master: numel fp32, or numel bf16 (stochastic rounding from plan.rounding_key, or Kahan when
//    compensation holds numel bf16 low parts); exp_avg / exp_avg_sq: state_bytes(moment_dtype,
//    numel) bytes each (int8: whole 1 KiB blocks from the sub-group's first element), exp_avg null
//    for Adagrad and exp_avg_sq null for Lion; grad: numel of grad_dtype; param_out: numel of
//    param_out_dtype (bf16 or fp16), or null.
//  - decay_runs: decay_run_count runs in device memory that tile [0, numel) in order (none: every
//    element takes weight decay); read by the kernel, so they must stay until the op has run.
//  - CUDA: arrays whose addresses are multiples of 16 bytes move as 16-byte vectors (others element
//    by element, the same bits); int8 moments must be 4-byte aligned.
struct OptimizerOp {
  cpu_adam::StepPlan plan;
  cpu_adam::StateDType master_dtype = cpu_adam::StateDType::kFp32;
  cpu_adam::StateDType moment_dtype = cpu_adam::StateDType::kFp32;
  std::uint64_t numel = 0;
  void* master = nullptr;
  void* compensation = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::kFp32;
  void* param_out = nullptr;
  DType param_out_dtype = DType::kBf16;
  const cpu_adam::DecayRun* decay_runs = nullptr;
  std::uint64_t decay_run_count = 0;
};

// *sum += the sum of squares of `count` elements of src (fp32, bf16 or fp16), in double, with the
// fixed shape of cpu_adam's norm (cpu_adam/norm_shape.hpp): the same bits as
// cpu_adam::sum_of_squares, and spans added in stream order as GradNormAccumulator::add adds them.
// The sum is not finite exactly when some element is inf or NaN (squares of finite fp32 values
// cannot overflow a double), which is the fp16 overflow check. block_sums: device scratch of
// sum_of_squares_scratch_bytes(count) (CUDA; HostDevice needs none). count 0 adds nothing.
struct SumOfSquaresOp {
  const void* src = nullptr;
  DType src_type = DType::kFp32;
  std::uint64_t count = 0;
  double* sum = nullptr;
  double* block_sums = nullptr;
};

// A host function run in stream order (like cudaLaunchHostFunc). It must not enqueue work on any
// stream of the device and must not wait on the device. An exception it throws is the stream's
// error, rethrown by the next Stream::synchronize().
struct HostCallbackOp {
  std::function<void()> function;
};

using DeviceOp = std::variant<CopyOp, CastOp, ScaleOp, FillOp, FillBytesOp, AccumulateOp,
                              OptimizerOp, SumOfSquaresOp, HostCallbackOp>;

}  // namespace strata::tiers
