#include "models/gpt/kernels.hpp"

#include <cblas.h>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <xsimd/xsimd.hpp>

#include "base/assert.hpp"
#include "models/gpt/gpt_math.hpp"

namespace strata::gpt::detail {
namespace {

using math::kGeluCoeff;
using math::kSqrtTwoOverPi;
using math::SerialReduce;

CBLAS_TRANSPOSE to_cblas(Transpose trans) {
  return trans == Transpose::kYes ? CblasTrans : CblasNoTrans;
}

blasint to_blasint(std::size_t value) {
  return static_cast<blasint>(value);
}

// Σ over rows of m[rows×cols] into out[cols], rows in order (deterministic, vectorises by column).
void column_sums(const float* m, std::size_t rows, std::size_t cols, float* out) {
  std::fill(out, out + cols, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      out[c] += row[c];
    }
  }
}

// Runs body(begin, end) over [0, count) in chunks of at least `grain` on the current oneTBB
// arena. Chunks write disjoint outputs, so results do not depend on how the range is split.
template <typename Body>
void parallel_chunks(std::size_t count, std::size_t grain, const Body& body) {
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, count, grain),
      [&](const tbb::blocked_range<std::size_t>& range) { body(range.begin(), range.end()); });
}

// Attention runs one small product per (sequence, head): too small for OpenBLAS's threads, whose
// hand-off would cost more than the product. They run single-threaded, heads in parallel on
// oneTBB; every head's arithmetic is then the same whatever the thread count.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_threads_(openblas_get_num_threads()) {
    if (saved_threads_ > 1) {
      openblas_set_num_threads(1);
    }
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;
  ~SingleThreadedBlas() {
    if (saved_threads_ > 1) {
      openblas_set_num_threads(saved_threads_);
    }
  }

 private:
  int saved_threads_;
};

constexpr std::size_t kRowGrain = 16;

}  // namespace

void gemm(Transpose trans_a, Transpose trans_b, std::size_t m, std::size_t n, std::size_t k,
          float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
          float* c, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), to_blasint(m), to_blasint(n),
              to_blasint(k), alpha, a, to_blasint(lda), b, to_blasint(ldb), beta, c,
              to_blasint(ldc));
}

void linear_forward(const float* x, const float* w, const float* bias, float* out, std::size_t rows,
                    std::size_t in_dim, std::size_t out_dim) {
  for (std::size_t r = 0; r < rows; ++r) {
    std::copy(bias, bias + out_dim, out + r * out_dim);
  }
  gemm(Transpose::kNo, Transpose::kNo, rows, out_dim, in_dim, 1.0f, x, in_dim, w, out_dim, 1.0f,
       out, out_dim);
}

void linear_backward(const float* dout, const float* x, const float* w, float* dx, float* dw,
                     float* dbias, std::size_t rows, std::size_t in_dim, std::size_t out_dim,
                     Accumulate accumulate_dx) {
  const float dx_beta = accumulate_dx == Accumulate::kYes ? 1.0f : 0.0f;
  gemm(Transpose::kNo, Transpose::kYes, rows, in_dim, out_dim, 1.0f, dout, out_dim, w, out_dim,
       dx_beta, dx, in_dim);
  gemm(Transpose::kYes, Transpose::kNo, in_dim, out_dim, rows, 1.0f, x, in_dim, dout, out_dim, 0.0f,
       dw, out_dim);
  column_sums(dout, rows, out_dim, dbias);
}

void layernorm_forward(const float* x, const float* weight, const float* bias, float* out,
                       float* mean, float* rstd, std::size_t rows, std::size_t dim) {
  parallel_chunks(rows, kRowGrain, [&](std::size_t row_begin, std::size_t row_end) {
    for (std::size_t r = row_begin; r < row_end; ++r) {
      math::layernorm_row_forward(x + r * dim, weight, bias, out + r * dim, mean + r, rstd + r, dim,
                                  0, 1, SerialReduce{});
    }
  });
}

void layernorm_backward(const float* dout, const float* x, const float* mean, const float* rstd,
                        const float* weight, float* dx, float* dweight, float* dbias,
                        std::size_t rows, std::size_t dim) {
  parallel_chunks(rows, kRowGrain, [&](std::size_t row_begin, std::size_t row_end) {
    for (std::size_t r = row_begin; r < row_end; ++r) {
      math::layernorm_row_backward(dout + r * dim, x + r * dim, mean[r], rstd[r], weight,
                                   dx + r * dim, dim, 0, 1, SerialReduce{});
    }
  });
  // Sums over rows: one thread, rows in order, so the bits never depend on the thread count.
  std::fill(dweight, dweight + dim, 0.0f);
  std::fill(dbias, dbias + dim, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = x + r * dim;
    const float* dout_row = dout + r * dim;
    const float mu = mean[r];
    const float s = rstd[r];
    for (std::size_t i = 0; i < dim; ++i) {
      dweight[i] += math::layernorm_weight_grad_term(dout_row[i], row[i], mu, s);
      dbias[i] += dout_row[i];
    }
  }
}

void gelu_forward(const float* x, float* out, float* tanh_out, std::size_t count) {
  using Batch = xsimd::batch<float>;
  constexpr std::size_t kLanes = Batch::size;
  constexpr std::size_t kChunk = 4096;  // elements per task, a multiple of every lane count
  parallel_chunks((count + kChunk - 1) / kChunk, 1,
                  [&](std::size_t chunk_begin, std::size_t chunk_end) {
                    const std::size_t begin = chunk_begin * kChunk;
                    const std::size_t end = std::min(count, chunk_end * kChunk);
                    const std::size_t vector_end = begin + (end - begin) / kLanes * kLanes;
                    for (std::size_t i = begin; i < vector_end; i += kLanes) {
                      const Batch v = Batch::load_unaligned(x + i);
                      const Batch t = xsimd::tanh(kSqrtTwoOverPi * (v + kGeluCoeff * v * v * v));
                      t.store_unaligned(tanh_out + i);
                      (0.5f * v * (1.0f + t)).store_unaligned(out + i);
                    }
                    for (std::size_t i = vector_end; i < end; ++i) {
                      const float v = x[i];
                      const float t = tanhf(math::gelu_tanh_argument(v));
                      tanh_out[i] = t;
                      out[i] = math::gelu_from_tanh(v, t);
                    }
                  });
}

void gelu_backward(const float* dout, const float* x, const float* tanh_in, float* dx,
                   std::size_t count) {
  parallel_chunks(count, 4096, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      dx[i] = dout[i] * math::gelu_derivative(x[i], tanh_in[i]);
    }
  });
}

std::size_t attention_scratch_floats(const AttentionShape& shape) {
  return shape.batch * shape.heads * shape.seq * shape.seq;
}

void attention_forward(const AttentionShape& shape, const float* qkv, float* prob, float* out) {
  const std::size_t seq = shape.seq;
  const std::size_t dim = shape.dim;
  const std::size_t head_dim = dim / shape.heads;
  const std::size_t qkv_stride = 3 * dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const SingleThreadedBlas single_threaded;
  parallel_chunks(shape.batch * shape.heads, 1, [&](std::size_t pair_begin, std::size_t pair_end) {
    for (std::size_t pair = pair_begin; pair < pair_end; ++pair) {
      const std::size_t b = pair / shape.heads;
      const std::size_t h = pair % shape.heads;
      const float* q = qkv + b * seq * qkv_stride + h * head_dim;
      const float* k = q + dim;
      const float* v = q + 2 * dim;
      float* p = prob + (b * shape.heads + h) * seq * seq;
      gemm(Transpose::kNo, Transpose::kYes, seq, seq, head_dim, scale, q, qkv_stride, k, qkv_stride,
           0.0f, p, seq);
      for (std::size_t i = 0; i < seq; ++i) {
        math::causal_softmax_row_forward(p + i * seq, i, seq, 0, 1, SerialReduce{});
      }
      gemm(Transpose::kNo, Transpose::kNo, seq, head_dim, seq, 1.0f, p, seq, v, qkv_stride, 0.0f,
           out + b * seq * dim + h * head_dim, dim);
    }
  });
}

void attention_backward(const AttentionShape& shape, const float* dout, const float* qkv,
                        const float* prob, float* dqkv, float* scratch) {
  const std::size_t seq = shape.seq;
  const std::size_t dim = shape.dim;
  const std::size_t head_dim = dim / shape.heads;
  const std::size_t qkv_stride = 3 * dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const SingleThreadedBlas single_threaded;
  parallel_chunks(shape.batch * shape.heads, 1, [&](std::size_t pair_begin, std::size_t pair_end) {
    for (std::size_t pair = pair_begin; pair < pair_end; ++pair) {
      const std::size_t b = pair / shape.heads;
      const std::size_t h = pair % shape.heads;
      const std::size_t qkv_offset = b * seq * qkv_stride + h * head_dim;
      const float* q = qkv + qkv_offset;
      const float* k = q + dim;
      const float* v = q + 2 * dim;
      float* dq = dqkv + qkv_offset;
      float* dk = dq + dim;
      float* dv = dq + 2 * dim;
      const float* dout_head = dout + b * seq * dim + h * head_dim;
      const float* p = prob + (b * shape.heads + h) * seq * seq;
      float* ds = scratch + (b * shape.heads + h) * seq * seq;
      // dP = dO·Vᵀ; dV = Pᵀ·dO.
      gemm(Transpose::kNo, Transpose::kYes, seq, seq, head_dim, 1.0f, dout_head, dim, v, qkv_stride,
           0.0f, ds, seq);
      gemm(Transpose::kYes, Transpose::kNo, seq, head_dim, seq, 1.0f, p, seq, dout_head, dim, 0.0f,
           dv, qkv_stride);
      // Softmax backward in place: dS_ij = P_ij·(dP_ij - Σ_k P_ik·dP_ik), zero above the diagonal.
      for (std::size_t i = 0; i < seq; ++i) {
        math::causal_softmax_row_backward(p + i * seq, ds + i * seq, i, seq, 0, 1, SerialReduce{});
      }
      // S = scale·Q·Kᵀ: dQ = scale·dS·K, dK = scale·dSᵀ·Q.
      gemm(Transpose::kNo, Transpose::kNo, seq, head_dim, seq, scale, ds, seq, k, qkv_stride, 0.0f,
           dq, qkv_stride);
      gemm(Transpose::kYes, Transpose::kNo, seq, head_dim, seq, scale, ds, seq, q, qkv_stride, 0.0f,
           dk, qkv_stride);
    }
  });
}

double cross_entropy(const float* logits, const std::int32_t* targets, float* dlogits,
                     std::size_t rows, std::size_t vocab) {
  double total = 0.0;
  const float inv_rows = 1.0f / static_cast<float>(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto target = static_cast<std::size_t>(targets[r]);
    STRATA_ASSERT(target < vocab);
    total += math::cross_entropy_row(logits + r * vocab, target, inv_rows, dlogits + r * vocab,
                                     vocab, 0, 1, SerialReduce{});
  }
  return total / static_cast<double>(rows);
}

}  // namespace strata::gpt::detail
