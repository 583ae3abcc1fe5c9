// The CPU optimizer step over host spans: AdamW, Adam, Adagrad and Lion, with gradient unscale,
// clip coefficient and an optional bf16/fp16 copy of the updated weights fused into one pass.
//
// Contract
//  - State is fp32 (master weights, exp_avg, exp_avg_sq); gradients are fp32, bf16 or fp16.
//  - Spans may start at any address (unaligned loads); 64-byte alignment is faster. They must not
//    overlap one another. All present spans have the same element count.
//  - The update is element-wise: the result is bitwise identical for every thread count, chunk size
//    and SIMD level (no FMA contraction; correctly rounded ops only; see docs/cpu_adam.md).
//  - Threads: work runs in `arena` (its size is the thread count). May be called from any thread,
//    including from inside `arena`. No allocation, no locks on this path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/typed_span.hpp"
#include "cpu_adam/exec_options.hpp"

namespace strata::cpu_adam {

enum class Algorithm {
  kAdamW,    // decoupled weight decay: param *= 1 - lr * wd, then the Adam update
  kAdam,     // L2: grad += wd * param, then the Adam update
  kAdagrad,  // sum += grad^2; param -= lr * grad / (sqrt(sum) + eps); L2 weight decay
  kLion,     // param *= 1 - lr * wd; param -= lr * sign(beta1 * m + (1 - beta1) * grad);
             // m = beta2 * m + (1 - beta2) * grad
};

enum class BiasCorrection { kOff, kOn };

// May change between steps (schedules). Held in double; rounded to fp32 once per call.
struct Hyperparams {
  Algorithm algorithm = Algorithm::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;    // Lion: the interpolation beta (0.9)
  double beta2 = 0.999;  // Lion: the momentum beta (0.99)
  double eps = 1e-8;     // Adam, Adagrad
  double weight_decay = 0.0;
  BiasCorrection bias_correction = BiasCorrection::kOn;  // Adam, AdamW
  std::int64_t step = 1;  // 1-based index of this update (bias correction uses beta^step)

  bool operator==(const Hyperparams&) const = default;
};

// One sub-group's state. exp_avg is unused by Adagrad, exp_avg_sq unused by Lion (pass empty).
struct ParamSpans {
  std::span<float> master;
  std::span<float> exp_avg;
  std::span<float> exp_avg_sq;  // Adagrad: the running sum of squared gradients
  ConstTypedSpan grad;          // fp32, bf16 or fp16
  TypedSpan param_out;          // optional (absent: null data): bf16 or fp16 copy of new master
};

// The gradient the update sees is grad * clip_coef / loss_scale (one fp32 multiplier).
struct GradScaling {
  double loss_scale = 1.0;  // > 0; the fp16 loss scale, 1 for bf16/fp32 training
  double clip_coef = 1.0;   // in (0, 1]; from clip_coefficient() in grad_norm.hpp
};

// Throws std::invalid_argument for hyper-parameters out of range (lr < 0, beta outside [0, 1),
// eps < 0, step < 1 with bias correction, loss_scale <= 0, non-finite values).
void validate(const Hyperparams& hyperparams, const GradScaling& scaling);

// One optimizer update of every element of `spans`.
void step(const Hyperparams& hyperparams, const ParamSpans& spans, const GradScaling& scaling,
          tbb::task_arena& arena, const ExecOptions& options = {});

// The memory bound an Adam/AdamW step() chases: reads and writes exactly the bytes that step()
// would for these spans (all three state arrays present), in place, with no arithmetic. The state
// is left as it was; param_out receives arbitrary bits. For benchmarks.
void stream_bound(const ParamSpans& spans, tbb::task_arena& arena, const ExecOptions& options = {});

// Bytes step() moves per element for this combination (what "GB/s" counts).
std::size_t bytes_per_element(Algorithm algorithm, DType grad_dtype,
                              std::optional<DType> param_out_dtype);

}  // namespace strata::cpu_adam
