// The optimizer step over compressed state (state_format.hpp): master weights in fp32 or bf16,
// moments in fp32, bf16 or int8 blocks, in one fused pass per block of kQuantBlockElems elements:
// decode the block's moments and master into fp32 (cache-resident), run the very update rule of
// step() (optimizer.hpp) on it, encode it back. Adam, AdamW, Adagrad and Lion are all supported.
//
// Contract
//  - A call covers one whole sub-group: int8 blocks start at its first element.
//  - bf16 master weights are rounded stochastically: the fp32 result plus 16 random bits, cut to
//    bf16, so E[rounded] = the fp32 result. The bits are a hash of (seed, step, first_element + i):
//    the same inputs give the same bits whatever the thread count, chunking or SIMD level, and
//    different sub-groups (different first_element) draw different bits.
//  - A bf16 master with `compensation` (Kahan; [optimizer] master_rounding = "kahan") is not
//    rounded stochastically: the update applies to weight + compensation (summed in fp32), and
//    its result is split back into the weight rounded to nearest and the rest cut toward zero to
//    bf16 (state_format.hpp's split_compensated). Deterministic, with no random bits.
//  - param_out, when present, receives the weights as kept: the rounded bf16 master converted, or
//    the fp32 master rounded to nearest even (as step() does).
//  - decay_runs, when not empty, cut the sub-group into runs that do or do not take weight decay
//    (per tensor); they must tile [0, numel) in order. Empty: every element takes it.
//  - Threads: work runs in `arena`, in whole blocks. No allocation on this path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/exec_options.hpp"
#include "cpu_adam/optimizer.hpp"
#include "cpu_adam/state_format.hpp"
#include "cpu_adam/step_plan.hpp"
#include "cpu_adam/typed_span.hpp"

namespace strata::cpu_adam {

struct CompressedSpans {
  std::uint64_t numel = 0;
  StateDType master_dtype = StateDType::kFp32;  // fp32 or bf16
  StateDType moment_dtype = StateDType::kFp32;  // fp32, bf16 or int8
  std::byte* master = nullptr;                  // state_bytes(master_dtype, numel) bytes
  std::byte* compensation = nullptr;  // bf16 master only: numel bf16 low parts (Kahan), or null
  std::byte* exp_avg = nullptr;       // state_bytes(moment_dtype, numel); null for Adagrad
  std::byte* exp_avg_sq = nullptr;    // the same; null for Lion
  ConstTypedSpan grad;                // numel elements, fp32, bf16 or fp16
  TypedSpan param_out;                // optional: numel bf16 or fp16 elements
};

struct StochasticRounding {
  std::uint64_t seed = 0;
  std::uint64_t first_element = 0;  // index of element 0 of this call in the caller's numbering
};

// Throws std::invalid_argument for a master dtype other than fp32/bf16 and for hyper-parameters
// out of range (validate() in optimizer.hpp).
void step_compressed(const Hyperparams& hyperparams, const CompressedSpans& spans,
                     const GradScaling& scaling, const StochasticRounding& rounding,
                     std::span<const DecayRun> decay_runs, tbb::task_arena& arena,
                     const ExecOptions& options = {});

// What the call above derives from its arguments (step_plan.hpp): validates them (throws as
// above), then picks the rule and rounds the constants and the rounding key exactly as it does.
// Another backend (the CUDA optimizer) given this plan reproduces step_compressed's bits.
StepPlan plan_step(const Hyperparams& hyperparams, const GradScaling& scaling,
                   const StochasticRounding& rounding);

// step_compressed() with its plan made already: step_compressed(h, spans, s, r, runs, arena) is
// step_compressed(plan_step(h, s, r), spans, runs, arena). Exp_avg is ignored by Adagrad and
// exp_avg_sq by Lion.
void step_compressed(const StepPlan& plan, const CompressedSpans& spans,
                     std::span<const DecayRun> decay_runs, tbb::task_arena& arena,
                     const ExecOptions& options = {});

// Bytes step_compressed() moves per element (the state read and written, grad, param_out).
double compressed_bytes_per_element(Algorithm algorithm, StateDType master_dtype,
                                    StateDType moment_dtype, DType grad_dtype,
                                    std::optional<DType> param_out_dtype, bool compensated = false);

}  // namespace strata::cpu_adam
