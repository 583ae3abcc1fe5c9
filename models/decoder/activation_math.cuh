// The MLP activations and their derivatives on the device, shared by the fp32 reference kernels
// (decoder_cuda_kernels.cu) and the bf16 ones (fused_kernels.cu) so both compute the same
// function the same way. fp32 throughout; the formulas are mlp_kernels.cpp's.
#pragma once

#include <cuda_runtime.h>

#include "models/decoder/decoder_cuda_kernels.hpp"

namespace strata::llm::cuda::detail {

inline constexpr float kGeluCoeff = 0.044715f;
inline constexpr float kSqrtTwoOverPi = 0.7978845608028654f;
inline constexpr float kInvSqrtTwo = 0.7071067811865476f;
inline constexpr float kInvSqrtTwoPi = 0.3989422804014327f;

__device__ inline float activate(ActivationCode act, float x) {
  switch (act) {
    case ActivationCode::kSilu:
      return x / (1.0f + expf(-x));
    case ActivationCode::kGeluTanh:
      return 0.5f * x * (1.0f + tanhf(kSqrtTwoOverPi * (x + kGeluCoeff * x * x * x)));
    case ActivationCode::kGelu:
      return 0.5f * x * (1.0f + erff(x * kInvSqrtTwo));
  }
  return 0.0f;
}

__device__ inline float derivative(ActivationCode act, float x) {
  switch (act) {
    case ActivationCode::kSilu: {
      const float s = 1.0f / (1.0f + expf(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case ActivationCode::kGeluTanh: {
      const float t = tanhf(kSqrtTwoOverPi * (x + kGeluCoeff * x * x * x));
      return 0.5f * (1.0f + t) +
             0.5f * x * (1.0f - t * t) * kSqrtTwoOverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
    }
    case ActivationCode::kGelu:
      return 0.5f * (1.0f + erff(x * kInvSqrtTwo)) + x * kInvSqrtTwoPi * expf(-0.5f * x * x);
  }
  return 0.0f;
}

}  // namespace strata::llm::cuda::detail
