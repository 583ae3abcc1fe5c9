#include "models/decoder/attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "models/gpt/kernels.hpp"
#include "models/decoder/parallel_rows.hpp"

namespace strata::llm::detail {
namespace {

using gpt::detail::gemm;
using gpt::detail::Transpose;

// OpenBLAS's own threads would cost more than these small products; restores the count after.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(openblas_get_num_threads()) {
    if (saved_ > 1) openblas_set_num_threads(1);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;
  ~SingleThreadedBlas() {
    if (saved_ > 1) openblas_set_num_threads(saved_);
  }

 private:
  int saved_;
};

// Keys [first, last] a query at `position` sees.
struct KeyRange {
  std::size_t first;
  std::size_t last;
};
KeyRange visible_keys(const AttentionShape& shape, std::size_t sequence, std::size_t query) {
  const std::size_t position = shape.keys - shape.queries + query;
  std::size_t first =
      shape.window != 0 && position + 1 > shape.window ? position + 1 - shape.window : 0;
  if (shape.first_key != nullptr) {
    first = std::max<std::size_t>(first, shape.first_key[sequence * shape.queries + query]);
  }
  return {first, position};
}

void softmax_row(float* row, KeyRange range, std::size_t keys) {
  float row_max = -INFINITY;
  for (std::size_t j = range.first; j <= range.last; ++j) row_max = std::max(row_max, row[j]);
  float sum = 0.0f;
  for (std::size_t j = range.first; j <= range.last; ++j) {
    row[j] = std::exp(row[j] - row_max);
    sum += row[j];
  }
  const float inv_sum = 1.0f / sum;
  std::fill(row, row + range.first, 0.0f);
  for (std::size_t j = range.first; j <= range.last; ++j) row[j] *= inv_sum;
  std::fill(row + range.last + 1, row + keys, 0.0f);
}

// In place on ds (dP on entry): dS_j = P_j·(dP_j - Σ_k P_k·dP_k); zero where masked.
void softmax_row_backward(const float* p, float* ds, KeyRange range, std::size_t keys) {
  float dot = 0.0f;
  for (std::size_t j = range.first; j <= range.last; ++j) dot += p[j] * ds[j];
  std::fill(ds, ds + range.first, 0.0f);
  for (std::size_t j = range.first; j <= range.last; ++j) ds[j] = p[j] * (ds[j] - dot);
  std::fill(ds + range.last + 1, ds + keys, 0.0f);
}

float scale_of(const AttentionShape& shape) {
  return 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
}

}  // namespace

std::size_t attention_prob_floats(const AttentionShape& shape) {
  return shape.sequences * shape.heads * shape.queries * shape.keys;
}

std::size_t attention_scratch_floats(const AttentionShape& shape) {
  return shape.sequences * shape.kv_heads * shape.queries * shape.keys;
}

void attention_forward(const AttentionShape& shape, ConstStrided q, ConstStrided k,
                       ConstStrided v, float* prob, Strided out) {
  const std::size_t group = shape.heads / shape.kv_heads;
  const std::size_t hd = shape.head_dim;
  const float scale = scale_of(shape);
  const SingleThreadedBlas single_threaded;
  parallel_rows(shape.sequences * shape.heads, 1, [&](std::size_t pair) {
    const std::size_t b = pair / shape.heads;
    const std::size_t h = pair % shape.heads;
    const std::size_t g = h / group;
    const float* q_h = q.data + b * shape.queries * q.ld + h * hd;
    const float* k_g = k.data + b * shape.keys * k.ld + g * hd;
    const float* v_g = v.data + b * shape.keys * v.ld + g * hd;
    float* p = prob + pair * shape.queries * shape.keys;
    gemm(Transpose::kNo, Transpose::kYes, shape.queries, shape.keys, hd, scale, q_h, q.ld, k_g,
         k.ld, 0.0f, p, shape.keys);
    for (std::size_t i = 0; i < shape.queries; ++i) {
      softmax_row(p + i * shape.keys, visible_keys(shape, b, i), shape.keys);
    }
    gemm(Transpose::kNo, Transpose::kNo, shape.queries, hd, shape.keys, 1.0f, p, shape.keys, v_g,
         v.ld, 0.0f, out.data + b * shape.queries * out.ld + h * hd, out.ld);
  });
}

void attention_backward(const AttentionShape& shape, ConstStrided dout, ConstStrided q,
                        ConstStrided k, ConstStrided v, const float* prob, Strided dq, Strided dk,
                        Strided dv, float* scratch) {
  const std::size_t group = shape.heads / shape.kv_heads;
  const std::size_t hd = shape.head_dim;
  const std::size_t nq = shape.queries;
  const std::size_t nk = shape.keys;
  const float scale = scale_of(shape);
  const SingleThreadedBlas single_threaded;
  // One task per (sequence, kv head): the heads of a group add into the same dk, dv in order.
  parallel_rows(shape.sequences * shape.kv_heads, 1, [&](std::size_t pair) {
    const std::size_t b = pair / shape.kv_heads;
    const std::size_t g = pair % shape.kv_heads;
    const float* k_g = k.data + b * nk * k.ld + g * hd;
    const float* v_g = v.data + b * nk * v.ld + g * hd;
    float* dk_g = dk.data + b * nk * dk.ld + g * hd;
    float* dv_g = dv.data + b * nk * dv.ld + g * hd;
    float* ds = scratch + pair * nq * nk;
    for (std::size_t member = 0; member < group; ++member) {
      const std::size_t h = g * group + member;
      const float beta = member == 0 ? 0.0f : 1.0f;
      const float* q_h = q.data + b * nq * q.ld + h * hd;
      const float* dout_h = dout.data + b * nq * dout.ld + h * hd;
      const float* p = prob + (b * shape.heads + h) * nq * nk;
      // dP = dO·Vᵀ; dV += Pᵀ·dO.
      gemm(Transpose::kNo, Transpose::kYes, nq, nk, hd, 1.0f, dout_h, dout.ld, v_g, v.ld, 0.0f, ds,
           nk);
      gemm(Transpose::kYes, Transpose::kNo, nk, hd, nq, 1.0f, p, nk, dout_h, dout.ld, beta, dv_g,
           dv.ld);
      for (std::size_t i = 0; i < nq; ++i) {
        softmax_row_backward(p + i * nk, ds + i * nk, visible_keys(shape, b, i), nk);
      }
      // S = scale·Q·Kᵀ: dQ = scale·dS·K, dK += scale·dSᵀ·Q.
      gemm(Transpose::kNo, Transpose::kNo, nq, hd, nk, scale, ds, nk, k_g, k.ld, 0.0f,
           dq.data + b * nq * dq.ld + h * hd, dq.ld);
      gemm(Transpose::kYes, Transpose::kNo, nk, hd, nq, scale, ds, nk, q_h, q.ld, beta, dk_g,
           dk.ld);
    }
  });
}

}  // namespace strata::llm::detail
