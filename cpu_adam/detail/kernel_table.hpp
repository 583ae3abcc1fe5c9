// The per-instruction-set kernel table: plain function pointers, one table per SimdLevel, each
// built in its own translation unit compiled with that level's flags (kernels_<level>.cpp).
// Internal to cpu_adam; the public entry points are in optimizer.hpp, grad_norm.hpp, cast.hpp.
#pragma once

#include <cstddef>

#include <cstdint>

#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/norm_shape.hpp"
#include "cpu_adam/simd_level.hpp"
#include "cpu_adam/state_format.hpp"
#include "cpu_adam/step_plan.hpp"
#include "cpu_adam/typed_span.hpp"

namespace strata::cpu_adam::detail {

// UpdateRule and UpdateConstants: step_plan.hpp (shared with the CUDA optimizer).
inline constexpr int kUpdateRuleCount = 3;

// Where the updated weights are also written: nowhere, as bf16, or as fp16. Index in the tables.
inline constexpr int kOutNone = 0;
inline constexpr int kOutBf16 = 1;
inline constexpr int kOutFp16 = 2;
inline constexpr int kOutCount = 3;

struct UpdateArgs {
  float* master = nullptr;
  float* exp_avg = nullptr;     // Adam, Lion
  float* exp_avg_sq = nullptr;  // Adam, Adagrad (the running sum of squares)
  const void* grad = nullptr;
  void* param_out = nullptr;
  // When set (step_compressed with int8 moments), Adam and Adagrad store sqrt(exp_avg_sq) here, the
  // root they divide by, so the square-law code of exp_avg_sq reuses it instead of taking it again.
  float* exp_avg_sq_root = nullptr;
  // step_compressed's bf16 master, updated in place and rounded stochastically: element i's noise
  // is stochastic_noise(rounding_high_key, rounding_first_low + i) (rounding_hash.hpp).
  Bf16* master_bf16 = nullptr;
  std::uint32_t rounding_high_key = 0;
  std::uint32_t rounding_first_low = 0;
  // ... or, Kahan-compensated (master_bf16 + master_low, joined and split as state_codec.hpp's
  // split_compensated do), updated in place with no rounding bits.
  Bf16* master_low = nullptr;
  // step_compressed's bf16 moments, updated in place (rounded to nearest). See kernel_impl.hpp.
  Bf16* exp_avg_bf16 = nullptr;
  Bf16* exp_avg_sq_bf16 = nullptr;
  UpdateConstants constants;
};

// step_compressed(): one sub-group, its state in the formats of state_format.hpp.
struct CompressedArgs {
  std::byte* master = nullptr;
  std::byte* compensation = nullptr;  // bf16 master only: Kahan's low parts (null: stochastic)
  std::byte* exp_avg = nullptr;
  std::byte* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  void* param_out = nullptr;
  std::uint64_t numel = 0;
  StateDType master_dtype = StateDType::kFp32;
  StateDType moment_dtype = StateDType::kFp32;
  UpdateConstants with_decay;     // the constants of elements that take weight decay
  UpdateConstants without_decay;  // ... and of those that do not (runs with weight_decay false)
  const DecayRun* runs = nullptr;  // tiles [0, numel) in order; none: every element decays
  std::size_t run_count = 0;
  std::uint64_t rounding_key = 0;   // stochastic rounding: from (seed, step)
  std::uint64_t first_element = 0;  // ... and the element's index
};

// Updates elements [begin, end).
using UpdateFn = void (*)(const UpdateArgs& args, std::size_t begin, std::size_t end);
// Sum of squares of elements [begin, end), accumulated in double in kNormLanes interleaved lanes
// (element i goes to lane (i - begin) % kNormLanes), the lanes then added in a fixed tree.
using NormFn = double (*)(const void* data, std::size_t begin, std::size_t end);
// The memory bound: reads and writes what UpdateFn does, in place, with no arithmetic.
using StreamFn = void (*)(const UpdateArgs& args, std::size_t begin, std::size_t end);
// Blocks [begin_block, end_block) of kQuantBlockElems elements (the last one may be short).
using CompressedFn = void (*)(const CompressedArgs& args, std::size_t begin_block,
                              std::size_t end_block);
// Elements [begin, begin + n) of a state array in `dtype` to or from fp32 values[0, n); int8:
// begin is a block start, n at most a block.
using DecodeFn = void (*)(StateDType dtype, MomentKind moment, const std::byte* state,
                          std::size_t begin, std::size_t n, float* values);
using EncodeFn = void (*)(StateDType dtype, MomentKind moment, const float* values,
                          std::size_t begin, std::size_t n, std::byte* state);
using ConvertFn = void (*)(const void* source, void* destination, std::size_t begin,
                           std::size_t end);
using ScaleFn = void (*)(void* data, float factor, std::size_t begin, std::size_t end);

struct KernelTable {
  SimdLevel level;
  UpdateFn update[kUpdateRuleCount][kDtypeCount][kOutCount];
  NormFn norm[kDtypeCount];
  StreamFn stream[kDtypeCount][kOutCount];
  ConvertFn convert[kDtypeCount][kDtypeCount];  // [source][destination]; identity entries are null
  ScaleFn scale[kDtypeCount];
  CompressedFn compressed[kUpdateRuleCount][kDtypeCount][kOutCount];
  DecodeFn decode;
  EncodeFn encode;
};

// Defined by each kernels_<level>.cpp that this build compiles (the x86 ones only on x86).
const KernelTable& scalar_kernels();
const KernelTable& sse2_kernels();
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();

// The table for `level`; STRATA_ASSERTs that the level is available.
const KernelTable& kernels_for(SimdLevel level);

}  // namespace strata::cpu_adam::detail
