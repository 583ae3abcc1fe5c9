// Shared by the device optimizer tests: one sub-group's optimizer state in a chosen format, held
// twice, in host memory for cpu_adam (the reference) and in a device's memory for
// Stream::optimizer_update, with guard bytes around every device array; random inputs from a seed.
#pragma once

#include <gtest/gtest.h>

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "cpu_adam/state_format.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers::testing {

struct StateFormat {
  cpu_adam::StateDType master;
  cpu_adam::StateDType moments;
  bool kahan;  // a bf16 master with its compensation
  const char* name;
};

// Every state format cpu_adam supports: masters fp32, bf16 rounded stochastically, bf16 + Kahan;
// moments fp32, bf16, int8.
inline constexpr StateFormat kStateFormats[] = {
    {cpu_adam::StateDType::kFp32, cpu_adam::StateDType::kFp32, false, "fp32"},
    {cpu_adam::StateDType::kFp32, cpu_adam::StateDType::kBf16, false, "fp32_master_bf16_moments"},
    {cpu_adam::StateDType::kFp32, cpu_adam::StateDType::kInt8, false, "fp32_master_int8_moments"},
    {cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kFp32, false, "bf16_master"},
    {cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kBf16, false, "bf16_master_bf16_moments"},
    {cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kInt8, false, "bf16_master_int8_moments"},
    {cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kFp32, true, "kahan_master"},
    {cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kBf16, true, "kahan_master_bf16_moments"},
    {cpu_adam::StateDType::kBf16, cpu_adam::StateDType::kInt8, true, "kahan_master_int8_moments"},
};

struct OptimizerCase {
  cpu_adam::Algorithm algorithm;
  StateFormat format;
  DType grad_dtype;
  std::optional<DType> out_dtype;  // param_out, or none
};

std::string case_name(const OptimizerCase& c);

// A sub-group: its length, whether every device array starts one element past a 16-byte boundary
// (the CUDA kernels then take their element-by-element path), and the index of its first element
// in the stochastic-rounding numbering.
struct Shape {
  std::uint64_t numel;
  bool misaligned;
  std::uint64_t first_element;
};

// Runs `steps` optimizer steps of `c` on `device` and with cpu_adam::step_compressed on host
// copies, from the same random state, gradients and plan (drawn from base_seed and the case); after
// each step every device array must equal the host's byte for byte (param_out is poisoned before
// each step, the int8 blocks' unused codes before the first) and every guard byte must be intact.
// Failures name the seed, the case, the shape, the step and the first differing element.
void expect_device_matches_cpu(Device& device, const OptimizerCase& c, const Shape& shape,
                               std::uint64_t base_seed, int steps, tbb::task_arena& arena);

// Elements of a sub-group that do (true) or do not take weight decay: three runs cut at odd
// places, or none for fewer than three elements.
std::vector<cpu_adam::DecayRun> decay_runs_for(std::uint64_t numel);

// The hyper-parameters and scaling of step `step` (1-based) of a case: learning rate, clip and
// loss scale change from step to step, weight decay is on.
cpu_adam::Hyperparams step_hyperparams(cpu_adam::Algorithm algorithm, int step);
cpu_adam::GradScaling step_scaling(DType grad_dtype, int step);

// `count` gradient-like values stored as `dtype` (finite in it), from `seed`.
std::vector<std::byte> random_grads(DType dtype, std::uint64_t count, std::uint64_t seed);

}  // namespace strata::tiers::testing
