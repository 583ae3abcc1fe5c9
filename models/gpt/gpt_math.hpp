// The GPT's per-element and per-row arithmetic, written once for the host kernels (kernels.cpp)
// and the CUDA kernels (cuda_kernels.cu). Every function is inline and STRATA_HOST_DEVICE, so the
// host tests (gradients against central differences, training) check the very code the GPU runs.
//
// Row functions split a row over `lanes` cooperating workers: worker `lane` visits the elements
// lane, lane + lanes, ... and `reduce` combines the workers' partial results. The host calls them
// with one lane and SerialReduce (a plain loop in element order); a CUDA warp calls them with 32
// lanes and a butterfly reduction. Either way the order of every sum is fixed, so each is
// deterministic run to run; host and GPU differ only in summation order and in the last bits of
// expf/tanhf/logf.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "base/host_device.hpp"

namespace strata::gpt::math {

inline constexpr float kLayerNormEps = 1e-5f;
inline constexpr float kGeluCoeff = 0.044715f;
inline constexpr float kSqrtTwoOverPi = 0x1.988452p-1f;  // sqrtf(2.0f / π in float)

// One worker per row: partial results are already the row's.
struct SerialReduce {
  STRATA_HOST_DEVICE float sum(float value) const { return value; }
  STRATA_HOST_DEVICE float max(float value) const { return value; }
};

STRATA_HOST_DEVICE inline float larger(float a, float b) {
  return b > a ? b : a;
}

// GELU (tanh approximation): t = tanh(gelu_tanh_argument(x)), gelu = 0.5·x·(1 + t).
STRATA_HOST_DEVICE inline float gelu_tanh_argument(float x) {
  return kSqrtTwoOverPi * (x + kGeluCoeff * x * x * x);
}
STRATA_HOST_DEVICE inline float gelu_from_tanh(float x, float t) {
  return 0.5f * x * (1.0f + t);
}
// d/dx 0.5·x·(1 + t): 0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3a·x²).
STRATA_HOST_DEVICE inline float gelu_derivative(float x, float t) {
  return 0.5f * (1.0f + t) +
         0.5f * x * (1.0f - t * t) * kSqrtTwoOverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
}

// LayerNorm of one row: out = (x - mean)·rstd·weight + bias; returns mean and rstd through the
// pointers (written by lane 0 only).
template <typename Reduce>
STRATA_HOST_DEVICE inline void layernorm_row_forward(const float* row, const float* weight,
                                                     const float* bias, float* out, float* mean,
                                                     float* rstd, std::size_t dim, std::size_t lane,
                                                     std::size_t lanes, const Reduce& reduce) {
  const float inv_dim = 1.0f / static_cast<float>(dim);
  float sum = 0.0f;
  for (std::size_t i = lane; i < dim; i += lanes) {
    sum += row[i];
  }
  const float mu = reduce.sum(sum) * inv_dim;
  float sum_sq = 0.0f;
  for (std::size_t i = lane; i < dim; i += lanes) {
    const float centred = row[i] - mu;
    sum_sq += centred * centred;
  }
  const float s = 1.0f / sqrtf(reduce.sum(sum_sq) * inv_dim + kLayerNormEps);
  for (std::size_t i = lane; i < dim; i += lanes) {
    out[i] = (row[i] - mu) * s * weight[i] + bias[i];
  }
  if (lane == 0) {
    *mean = mu;
    *rstd = s;
  }
}

// LayerNorm's input gradient for one row, added into dx:
// dx += s·(dxhat - mean(dxhat) - xhat·mean(dxhat·xhat)), dxhat = dout·weight, xhat = (x - mu)·s.
template <typename Reduce>
STRATA_HOST_DEVICE inline void layernorm_row_backward(const float* dout, const float* row, float mu,
                                                      float s, const float* weight, float* dx,
                                                      std::size_t dim, std::size_t lane,
                                                      std::size_t lanes, const Reduce& reduce) {
  const float inv_dim = 1.0f / static_cast<float>(dim);
  float sum_dxhat = 0.0f;
  float sum_dxhat_xhat = 0.0f;
  for (std::size_t i = lane; i < dim; i += lanes) {
    const float xhat = (row[i] - mu) * s;
    const float dxhat = dout[i] * weight[i];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * xhat;
  }
  const float mean_dxhat = reduce.sum(sum_dxhat) * inv_dim;
  const float mean_dxhat_xhat = reduce.sum(sum_dxhat_xhat) * inv_dim;
  for (std::size_t i = lane; i < dim; i += lanes) {
    const float xhat = (row[i] - mu) * s;
    const float dxhat = dout[i] * weight[i];
    dx[i] += s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
  }
}

// One element's share of LayerNorm's weight gradient: dout·xhat.
STRATA_HOST_DEVICE inline float layernorm_weight_grad_term(float dout, float x, float mu, float s) {
  return dout * ((x - mu) * s);
}

// Causal softmax of row `i` of a seq × seq score matrix, in place: columns 0..i become
// probabilities, the rest zeros.
template <typename Reduce>
STRATA_HOST_DEVICE inline void causal_softmax_row_forward(float* row, std::size_t i,
                                                          std::size_t seq, std::size_t lane,
                                                          std::size_t lanes, const Reduce& reduce) {
  float row_max = -INFINITY;
  for (std::size_t j = lane; j <= i; j += lanes) {
    row_max = larger(row_max, row[j]);
  }
  row_max = reduce.max(row_max);
  float sum = 0.0f;
  for (std::size_t j = lane; j <= i; j += lanes) {
    row[j] = expf(row[j] - row_max);
    sum += row[j];
  }
  const float inv_sum = 1.0f / reduce.sum(sum);
  for (std::size_t j = lane; j <= i; j += lanes) {
    row[j] *= inv_sum;
  }
  for (std::size_t j = i + 1 + lane; j < seq; j += lanes) {
    row[j] = 0.0f;
  }
}

// Softmax backward of row `i`, in place on ds (which holds dP on entry):
// dS_ij = P_ij·(dP_ij - Σ_k P_ik·dP_ik), zero above the diagonal.
template <typename Reduce>
STRATA_HOST_DEVICE inline void causal_softmax_row_backward(const float* p_row, float* ds_row,
                                                           std::size_t i, std::size_t seq,
                                                           std::size_t lane, std::size_t lanes,
                                                           const Reduce& reduce) {
  float dot = 0.0f;
  for (std::size_t j = lane; j <= i; j += lanes) {
    dot += p_row[j] * ds_row[j];
  }
  dot = reduce.sum(dot);
  for (std::size_t j = lane; j <= i; j += lanes) {
    ds_row[j] = p_row[j] * (ds_row[j] - dot);
  }
  for (std::size_t j = i + 1 + lane; j < seq; j += lanes) {
    ds_row[j] = 0.0f;
  }
}

// Cross-entropy of one row of logits against `target`: returns -log softmax[target] in double
// and writes drow = (softmax - onehot)·inv_rows.
template <typename Reduce>
STRATA_HOST_DEVICE inline double cross_entropy_row(const float* row, std::size_t target,
                                                   float inv_rows, float* drow, std::size_t vocab,
                                                   std::size_t lane, std::size_t lanes,
                                                   const Reduce& reduce) {
  float row_max = -INFINITY;
  for (std::size_t i = lane; i < vocab; i += lanes) {
    row_max = larger(row_max, row[i]);
  }
  row_max = reduce.max(row_max);
  float sum = 0.0f;
  for (std::size_t i = lane; i < vocab; i += lanes) {
    drow[i] = expf(row[i] - row_max);
    sum += drow[i];
  }
  sum = reduce.sum(sum);
  const float scale = inv_rows / sum;
  for (std::size_t i = lane; i < vocab; i += lanes) {
    drow[i] *= scale;
    if (i == target) {
      drow[i] -= inv_rows;
    }
  }
  // -log softmax[target] = log Σ exp(l - max) - (l_target - max).
  return static_cast<double>(logf(sum)) - static_cast<double>(row[target] - row_max);
}

}  // namespace strata::gpt::math
