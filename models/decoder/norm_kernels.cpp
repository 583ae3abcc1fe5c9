#include "models/decoder/norm_kernels.hpp"

#include <algorithm>
#include <cmath>

#include "models/decoder/parallel_rows.hpp"

namespace strata::llm::detail {
namespace {

constexpr std::size_t kRowGrain = 16;

}  // namespace

void rms_norm_forward(const NormShape& shape, const float* x, const float* weight, float* y,
                      float* rstd) {
  const std::size_t dim = shape.dim;
  parallel_rows(shape.rows, kRowGrain, [&](std::size_t r) {
    const float* row = x + r * dim;
    float sum_sq = 0.0f;
    for (std::size_t i = 0; i < dim; ++i) sum_sq += row[i] * row[i];
    const float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + shape.eps);
    rstd[r] = s;
    float* out = y + r * dim;
    for (std::size_t i = 0; i < dim; ++i) out[i] = weight[i] * (row[i] * s);
  });
}

void rms_norm_backward(const NormShape& shape, const float* dy, const float* x, const float* rstd,
                       const float* weight, float* dx, float* dweight) {
  const std::size_t dim = shape.dim;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  // y_i = w_i·x_i·s with s = (mean(x²) + eps)^(-1/2), so ds/dx_j = -s³·x_j / dim and
  // dx_j = s·g_j - x_j·s³·Σ_i g_i·x_i / dim, g = dy·w.
  parallel_rows(shape.rows, kRowGrain, [&](std::size_t r) {
    const float* row = x + r * dim;
    const float* dy_row = dy + r * dim;
    const float s = rstd[r];
    float dot = 0.0f;
    for (std::size_t i = 0; i < dim; ++i) dot += dy_row[i] * weight[i] * row[i];
    const float coefficient = dot * s * s * s * inv_dim;
    float* dx_row = dx + r * dim;
    for (std::size_t i = 0; i < dim; ++i) {
      dx_row[i] += s * dy_row[i] * weight[i] - row[i] * coefficient;
    }
  });
  std::fill(dweight, dweight + dim, 0.0f);
  for (std::size_t r = 0; r < shape.rows; ++r) {
    const float* row = x + r * dim;
    const float* dy_row = dy + r * dim;
    for (std::size_t i = 0; i < dim; ++i) dweight[i] += dy_row[i] * (row[i] * rstd[r]);
  }
}

void layer_norm_forward(const NormShape& shape, const float* x, const float* weight,
                        const float* bias, float* y, float* mean, float* rstd) {
  const std::size_t dim = shape.dim;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  parallel_rows(shape.rows, kRowGrain, [&](std::size_t r) {
    const float* row = x + r * dim;
    float sum = 0.0f;
    for (std::size_t i = 0; i < dim; ++i) sum += row[i];
    const float mu = sum * inv_dim;
    float sum_sq = 0.0f;
    for (std::size_t i = 0; i < dim; ++i) sum_sq += (row[i] - mu) * (row[i] - mu);
    const float s = 1.0f / std::sqrt(sum_sq * inv_dim + shape.eps);
    mean[r] = mu;
    rstd[r] = s;
    float* out = y + r * dim;
    for (std::size_t i = 0; i < dim; ++i) out[i] = (row[i] - mu) * s * weight[i] + bias[i];
  });
}

void layer_norm_backward(const NormShape& shape, const float* dy, const float* x,
                         const float* mean, const float* rstd, const float* weight, float* dx,
                         float* dweight, float* dbias) {
  const std::size_t dim = shape.dim;
  const float inv_dim = 1.0f / static_cast<float>(dim);
  // dx = s·(g - mean(g) - xhat·mean(g·xhat)), g = dy·w, xhat = (x - mean)·s.
  parallel_rows(shape.rows, kRowGrain, [&](std::size_t r) {
    const float* row = x + r * dim;
    const float* dy_row = dy + r * dim;
    const float mu = mean[r];
    const float s = rstd[r];
    float sum_g = 0.0f;
    float sum_g_xhat = 0.0f;
    for (std::size_t i = 0; i < dim; ++i) {
      const float g = dy_row[i] * weight[i];
      sum_g += g;
      sum_g_xhat += g * ((row[i] - mu) * s);
    }
    const float mean_g = sum_g * inv_dim;
    const float mean_g_xhat = sum_g_xhat * inv_dim;
    float* dx_row = dx + r * dim;
    for (std::size_t i = 0; i < dim; ++i) {
      const float xhat = (row[i] - mu) * s;
      dx_row[i] += s * (dy_row[i] * weight[i] - mean_g - xhat * mean_g_xhat);
    }
  });
  std::fill(dweight, dweight + dim, 0.0f);
  std::fill(dbias, dbias + dim, 0.0f);
  for (std::size_t r = 0; r < shape.rows; ++r) {
    const float* row = x + r * dim;
    const float* dy_row = dy + r * dim;
    for (std::size_t i = 0; i < dim; ++i) {
      dweight[i] += dy_row[i] * ((row[i] - mean[r]) * rstd[r]);
      dbias[i] += dy_row[i];
    }
  }
}

}  // namespace strata::llm::detail
