#include "models/decoder/mlp_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "models/decoder/parallel_rows.hpp"

namespace strata::llm::detail {
namespace {

constexpr float kGeluCoeff = 0.044715f;
const float kSqrtTwoOverPi = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
const float kInvSqrtTwo = static_cast<float>(1.0 / std::numbers::sqrt2);
const float kInvSqrtTwoPi = static_cast<float>(1.0 / std::sqrt(2.0 * std::numbers::pi));

float activate(Activation act, float x) {
  switch (act) {
    case Activation::kSilu:
      return x / (1.0f + std::exp(-x));
    case Activation::kGeluTanh:
      return 0.5f * x * (1.0f + std::tanh(kSqrtTwoOverPi * (x + kGeluCoeff * x * x * x)));
    case Activation::kGelu:
      return 0.5f * x * (1.0f + std::erf(x * kInvSqrtTwo));
  }
  return 0.0f;
}

float derivative(Activation act, float x) {
  switch (act) {
    case Activation::kSilu: {
      const float s = 1.0f / (1.0f + std::exp(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case Activation::kGeluTanh: {
      const float t = std::tanh(kSqrtTwoOverPi * (x + kGeluCoeff * x * x * x));
      return 0.5f * (1.0f + t) +
             0.5f * x * (1.0f - t * t) * kSqrtTwoOverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
    }
    case Activation::kGelu:
      return 0.5f * (1.0f + std::erf(x * kInvSqrtTwo)) +
             x * kInvSqrtTwoPi * std::exp(-0.5f * x * x);
  }
  return 0.0f;
}

constexpr std::size_t kChunk = 4096;

template <typename Body>
void parallel_elements(std::size_t count, const Body& body) {
  parallel_rows((count + kChunk - 1) / kChunk, 1, [&](std::size_t chunk) {
    const std::size_t end = std::min(count, (chunk + 1) * kChunk);
    for (std::size_t i = chunk * kChunk; i < end; ++i) body(i);
  });
}

}  // namespace

void gated_forward(Activation act, const float* pre, float* h, std::size_t rows,
                   std::size_t inner) {
  parallel_rows(rows, 4, [&](std::size_t r) {
    const float* gate = pre + r * 2 * inner;
    const float* up = gate + inner;
    float* out = h + r * inner;
    for (std::size_t i = 0; i < inner; ++i) out[i] = activate(act, gate[i]) * up[i];
  });
}

void gated_backward(Activation act, const float* dh, const float* pre, float* dpre,
                    std::size_t rows, std::size_t inner) {
  parallel_rows(rows, 4, [&](std::size_t r) {
    const float* gate = pre + r * 2 * inner;
    const float* up = gate + inner;
    const float* d = dh + r * inner;
    float* dgate = dpre + r * 2 * inner;
    float* dup = dgate + inner;
    for (std::size_t i = 0; i < inner; ++i) {
      dgate[i] = d[i] * up[i] * derivative(act, gate[i]);
      dup[i] = d[i] * activate(act, gate[i]);
    }
  });
}

void plain_forward(Activation act, const float* pre, float* h, std::size_t count) {
  parallel_elements(count, [&](std::size_t i) { h[i] = activate(act, pre[i]); });
}

void plain_backward(Activation act, const float* dh, const float* pre, float* dpre,
                    std::size_t count) {
  parallel_elements(count, [&](std::size_t i) { dpre[i] = dh[i] * derivative(act, pre[i]); });
}

}  // namespace strata::llm::detail
