// The per-element arithmetic of the CUDA optimizer (cuda_optimizer.cu), written to reproduce
// cpu_adam's kernels bit for bit (cpu_adam/detail/kernel_impl.hpp, state_codec.hpp): the same fp32
// operations in the same order, each an explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn,
// __fsub_rn, __fdiv_rn, __fsqrt_rn), which nvcc never contracts into an fma (the CPU uses none),
// and the file is compiled with -fmad=false -ftz=false -prec-div=true -prec-sqrt=true besides.
// Conversions are base/float16.hpp's and the rounding hash is cpu_adam/rounding_hash.hpp's, the
// very functions the CPU calls. Include only from cuda_optimizer.cu.
#pragma once

#include <cstdint>

#include "base/float16.hpp"
#include "cpu_adam/rounding_hash.hpp"
#include "cpu_adam/state_dtype.hpp"
#include "cpu_adam/step_plan.hpp"

namespace strata::tiers::detail::gpu {

using cpu_adam::UpdateConstants;

__device__ __forceinline__ float mul(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float add(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float sub(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ float div(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ float sqrt_rn(float a) {
  return __fsqrt_rn(a);
}
// ScalarOps::min / max: selects, so a NaN operand behaves as on the CPU.
__device__ __forceinline__ float min_of(float a, float b) {
  return b < a ? b : a;
}
// ScalarOps::sign: (x > 0) - (x < 0), 0 for zeros and NaN.
__device__ __forceinline__ float sign_of(float x) {
  return sub(static_cast<float>(x > 0.0f), static_cast<float>(x < 0.0f));
}

// The update rules (kernel_impl.hpp's AdamRule, AdagradRule, LionRule), operation by operation.
// grad is the raw gradient as fp32; param, exp_avg and exp_avg_sq are updated in place; the
// return value is sqrt(exp_avg_sq), the root the update divided by (the int8 code of exp_avg_sq
// reuses it), or 0 for Lion.
struct AdamRule {
  static constexpr bool kExpAvg = true;
  static constexpr bool kExpAvgSq = true;
  __device__ __forceinline__ static float apply(const UpdateConstants& c, float raw_grad,
                                                float& param, float& exp_avg, float& exp_avg_sq) {
    float grad = mul(raw_grad, c.grad_multiplier);
    if (c.use_l2) grad = add(grad, mul(c.l2, param));
    exp_avg = add(mul(c.beta1, exp_avg), mul(c.one_minus_beta1, grad));
    exp_avg_sq = add(mul(c.beta2, exp_avg_sq), mul(c.one_minus_beta2, mul(grad, grad)));
    const float root = sqrt_rn(exp_avg_sq);
    const float denom = add(mul(root, c.inv_sqrt_bias_correction2), c.eps);
    if (c.use_decay) param = mul(param, c.decay);
    param = sub(param, mul(c.step_size, div(exp_avg, denom)));
    return root;
  }
};

struct AdagradRule {
  static constexpr bool kExpAvg = false;
  static constexpr bool kExpAvgSq = true;
  __device__ __forceinline__ static float apply(const UpdateConstants& c, float raw_grad,
                                                float& param, float& /*exp_avg*/, float& sum_sq) {
    float grad = mul(raw_grad, c.grad_multiplier);
    if (c.use_l2) grad = add(grad, mul(c.l2, param));
    sum_sq = add(sum_sq, mul(grad, grad));
    const float root = sqrt_rn(sum_sq);
    param = sub(param, mul(c.step_size, div(grad, add(root, c.eps))));
    return root;
  }
};

struct LionRule {
  static constexpr bool kExpAvg = true;
  static constexpr bool kExpAvgSq = false;
  __device__ __forceinline__ static float apply(const UpdateConstants& c, float raw_grad,
                                                float& param, float& exp_avg,
                                                float& /*exp_avg_sq*/) {
    const float grad = mul(raw_grad, c.grad_multiplier);
    const float direction = add(mul(c.beta1, exp_avg), mul(c.one_minus_beta1, grad));
    if (c.use_decay) param = mul(param, c.decay);
    param = sub(param, mul(c.step_size, sign_of(direction)));
    exp_avg = add(mul(c.beta2, exp_avg), mul(c.one_minus_beta2, grad));
    return 0.0f;
  }
};

// ---- 16-bit and Kahan master weights (kernel_impl.hpp's load_master / store_master) ----------

__device__ __forceinline__ float bf16_value(std::uint16_t bits) {
  return to_float(Bf16{bits});
}

// Element `element` (the caller's numbering) rounded stochastically to bf16.
__device__ __forceinline__ std::uint16_t round_master(float value, std::uint64_t rounding_key,
                                                      std::uint64_t element) {
  const std::uint32_t noise = cpu_adam::stochastic_noise(
      cpu_adam::rounding_high_key(rounding_key, element), static_cast<std::uint32_t>(element));
  return cpu_adam::round_stochastic(value, noise).bits;
}

// Kahan join: weight + low, or the weight itself (its sign of zero included) when low is zero.
__device__ __forceinline__ float join_compensated(std::uint16_t weight, std::uint16_t low) {
  const float high_part = bf16_value(weight);
  const float low_part = bf16_value(low);
  return low_part == 0.0f ? high_part : add(high_part, low_part);
}

// Kahan split: the weight to nearest even, the rest (exact in fp32) cut toward zero to bf16, a
// NaN rest as zero and a zero rest as +0.
__device__ __forceinline__ void split_compensated(float value, std::uint16_t& weight,
                                                  std::uint16_t& low) {
  weight = to_bf16(value).bits;
  float residual = sub(value, bf16_value(weight));
  residual = residual == residual ? residual : 0.0f;
  const float cut = strata::detail::bits_float(strata::detail::float_bits(residual) & 0xFFFF'0000u);
  low = to_bf16(add(cut, 0.0f)).bits;
}

// ---- int8 moment codes (state_codec.hpp's SignedCode, UnsignedCode, encode_root_block) ------

__device__ __forceinline__ float decode_signed(std::int8_t code, float scale) {
  const float q = static_cast<float>(code);
  return mul(scale, mul(mul(q, fabsf(q)), cpu_adam::kSignedCodeInverseSquare));
}

__device__ __forceinline__ float decode_unsigned(std::uint8_t code, float scale) {
  const float t = mul(static_cast<float>(code), cpu_adam::kUnsignedCodeInverse);
  const float t2 = mul(t, t);
  return mul(scale, mul(t2, t2));
}

// inverse_scale: 1 / scale (0 for a zero scale). Truncation as cvttss2si.
__device__ __forceinline__ std::int8_t encode_signed(float value, float inverse_scale) {
  const float position = mul(sqrt_rn(mul(fabsf(value), inverse_scale)), cpu_adam::kSignedCodeMax);
  const float magnitude = min_of(add(position, 0.5f), cpu_adam::kSignedCodeMax);
  return static_cast<std::int8_t>(static_cast<int>(copysignf(magnitude, value)));
}

// root: sqrt(value), which the update took; factor: root_code_factor(scale).
__device__ __forceinline__ std::uint8_t encode_unsigned_root(float root, float factor) {
  const float position = mul(sqrt_rn(root), factor);
  return static_cast<std::uint8_t>(
      static_cast<int>(min_of(add(position, 0.5f), cpu_adam::kUnsignedCodeMax)));
}

// 255 / scale^(1/4), in double and rounded once, as encode_root_block computes it.
__device__ __forceinline__ float root_code_factor(float scale) {
  if (!(scale > 0.0f)) return 0.0f;
  return static_cast<float>(__ddiv_rn(255.0, __dsqrt_rn(__dsqrt_rn(static_cast<double>(scale)))));
}

__device__ __forceinline__ float inverse_of(float scale) {
  return scale > 0.0f ? div(1.0f, scale) : 0.0f;
}

}  // namespace strata::tiers::detail::gpu
