// What one optimizer update of a sub-group is, besides its arrays: the update rule, the per-step
// fp32 constants (with and without weight decay), the per-tensor weight-decay runs and the
// stochastic-rounding key. step_compressed() runs a StepPlan on host memory; the CUDA optimizer
// (tiers/device/cuda_optimizer.cu) runs the very same plan on device memory, which is how the two
// give the same bits. Plain C++17 with no TBB: the CUDA sources include it.
#pragma once

#include <cstdint>

namespace strata::cpu_adam {

// The element-wise rules: AdamW and Adam share kAdam (they differ only in the constants: decoupled
// decay against L2), Adagrad and Lion have their own.
enum class UpdateRule : std::uint8_t { kAdam = 0, kAdagrad = 1, kLion = 2 };

constexpr bool rule_uses_exp_avg(UpdateRule rule) {
  return rule != UpdateRule::kAdagrad;
}
constexpr bool rule_uses_exp_avg_sq(UpdateRule rule) {
  return rule != UpdateRule::kLion;
}

// Per-step constants, computed once in double on the host and rounded to fp32 once, so every
// element (every SIMD level, and the GPU) uses the very same fp32 operands.
struct UpdateConstants {
  float grad_multiplier = 1;  // clip_coef / loss_scale
  float beta1 = 0;
  float one_minus_beta1 = 1;
  float beta2 = 0;
  float one_minus_beta2 = 1;
  float step_size = 0;                  // Adam: lr / (1 - beta1^t); Adagrad, Lion: lr
  float inv_sqrt_bias_correction2 = 1;  // 1 / sqrt(1 - beta2^t)
  float eps = 0;
  float decay = 1;         // decoupled weight decay factor 1 - lr * wd (AdamW, Lion)
  float l2 = 0;            // L2 weight decay added to the gradient (Adam, Adagrad)
  bool use_l2 = false;     // add l2 * param to the gradient
  bool use_decay = false;  // multiply the param by `decay`
};

// Elements [begin, begin + numel) of a sub-group, which do or do not take weight decay (per
// tensor). A list of runs tiles the sub-group in order; no list means every element takes it.
struct DecayRun {
  std::uint64_t begin = 0;  // element of the sub-group
  std::uint64_t numel = 0;
  bool weight_decay = true;
};

struct StepPlan {
  UpdateRule rule = UpdateRule::kAdam;
  UpdateConstants with_decay;     // the constants of elements that take weight decay
  UpdateConstants without_decay;  // ... and of those that do not
  // bf16 masters, stochastic rounding: element i of the call draws its noise from
  // (rounding_key, first_element + i) (cpu_adam/rounding_hash.hpp).
  std::uint64_t rounding_key = 0;
  std::uint64_t first_element = 0;
};

}  // namespace strata::cpu_adam
