// What flash_attention_cuda_test.cpp runs its kernels with: device arrays, a batch of attention
// inputs in the decoder's fused q | k | v layout, one forward + backward through a chosen kernel
// with every output poisoned (NaN) first, and the error measures its bounds are stated in.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/decoder/cuda_device_array.hpp"
#include "models/decoder/decoder_cuda_kernels.hpp"
#include "models/decoder/flash_attention.hpp"

namespace strata::llm::cuda::testing {

using cuda::check_cuda;
using cuda::DeviceArray;

struct Shape {
  std::size_t sequences, positions, heads, kv_heads, head_dim, window;
  std::size_t document;  // mean packed-document length; 0: one document per sequence
};

// Attention inputs as the decoder holds them: qkv rows [q | k | v] (heads, kv_heads, kv_heads
// heads of head_dim), dout rows [heads × head_dim], one first key per row.
struct Batch {
  Shape shape;
  std::vector<float> qkv, dout;
  std::vector<std::uint32_t> first_key;

  std::size_t rows() const { return shape.sequences * shape.positions; }
  std::size_t q_width() const { return shape.heads * shape.head_dim; }
  std::size_t kv_width() const { return shape.kv_heads * shape.head_dim; }
  std::size_t qkv_width() const { return q_width() + 2 * kv_width(); }
  std::size_t k_offset() const { return q_width(); }
  std::size_t v_offset() const { return q_width() + kv_width(); }
  // Whether the query at `query` of sequence b sees `key` (decoder_cuda_kernels' visible()).
  bool sees(std::size_t b, std::size_t query, std::size_t key) const {
    return key <= query && (shape.window == 0 || query - key < shape.window) &&
           key >= first_key[b * shape.positions + query];
  }
};

// N(0, 1) q, k, v and dout; with shape.document, documents start at random positions (each
// position starts one with probability 1 / document), so boundaries fall anywhere in the tiles.
inline Batch random_batch(const Shape& shape, std::uint64_t seed) {
  Batch batch{shape, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  batch.qkv.resize(batch.rows() * batch.qkv_width());
  batch.dout.resize(batch.rows() * batch.q_width());
  for (float& x : batch.qkv) x = normal(rng);
  for (float& x : batch.dout) x = normal(rng);
  batch.first_key.resize(batch.rows());
  for (std::size_t b = 0; b < shape.sequences; ++b) {
    std::uint32_t start = 0;
    for (std::size_t i = 0; i < shape.positions; ++i) {
      if (i > 0 && shape.document != 0 && rng() % shape.document == 0) {
        start = static_cast<std::uint32_t>(i);
      }
      batch.first_key[b * shape.positions + i] = start;
    }
  }
  return batch;
}

inline __nv_bfloat16 to_bf16(float x) {
  return __float2bfloat16_rn(x);
}

enum class Kernel {
  kFp32,       // decoder_cuda_kernels' attention_forward / attention_backward: the reference
  kFlash,      // flash_attention's fp32 interface (rounds into a scratch)
  kFlashBf16,  // flash_attention's bf16 interface, q | k | v and dout rounded on the host
};

struct Results {
  std::vector<float> out, lse, dqkv;  // dqkv: the gradient in qkv's layout
};

// One forward and one backward of `batch` through `kernel`, outputs poisoned before each run.
inline Results run(const Batch& batch, Kernel kernel) {
  const Shape& s = batch.shape;
  const std::size_t rows = batch.rows();
  const std::size_t ld = batch.qkv_width();
  DeviceArray<float> qkv(batch.qkv), dout(batch.dout);
  DeviceArray<std::uint32_t> first_key(batch.first_key);
  DeviceArray<float> out(rows * batch.q_width()), lse(s.sequences * s.heads * s.positions);
  DeviceArray<float> delta(s.sequences * s.heads * s.positions), dqkv(rows * ld);
  for (DeviceArray<float>* poisoned : {&out, &lse, &delta, &dqkv}) poisoned->poison();
  const AttentionDims dims{s.sequences, s.positions, s.heads,        s.kv_heads,
                           s.head_dim,  s.window,    first_key.get()};
  const float* q = qkv.get();
  const float* k = q + batch.k_offset();
  const float* v = q + batch.v_offset();
  float* dq = dqkv.get();
  float* dk = dq + batch.k_offset();
  float* dv = dq + batch.v_offset();
  const std::size_t ld_out = batch.q_width();
  if (kernel == Kernel::kFp32) {
    check_cuda(attention_forward(dims, q, k, v, ld, out.get(), ld_out, lse.get(), nullptr),
               "attention_forward");
    check_cuda(attention_backward(dims, dout.get(), ld_out, out.get(), q, k, v, ld, lse.get(),
                                  delta.get(), dq, dk, dv, nullptr),
               "attention_backward");
  } else if (kernel == Kernel::kFlash) {
    DeviceArray<__nv_bfloat16> scratch(flash_attention_scratch_elements(dims));
    check_cuda(flash_attention_forward(dims, q, k, v, ld, out.get(), ld_out, lse.get(),
                                       scratch.get(), nullptr),
               "flash_attention_forward");
    check_cuda(flash_attention_backward(dims, dout.get(), ld_out, out.get(), q, k, v, ld, lse.get(),
                                        delta.get(), dq, dk, dv, scratch.get(), nullptr),
               "flash_attention_backward");
  } else {
    std::vector<__nv_bfloat16> qkv16(batch.qkv.size()), dout16(batch.dout.size());
    std::transform(batch.qkv.begin(), batch.qkv.end(), qkv16.begin(), to_bf16);
    std::transform(batch.dout.begin(), batch.dout.end(), dout16.begin(), to_bf16);
    const DeviceArray<__nv_bfloat16> qkv_b(qkv16), dout_b(dout16);
    DeviceArray<__nv_bfloat16> out_b(rows * ld_out);
    const __nv_bfloat16* q_b = qkv_b.get();
    check_cuda(flash_attention_forward(dims, {q_b, ld}, {q_b + batch.k_offset(), ld},
                                       {q_b + batch.v_offset(), ld}, {out.get(), ld_out}, lse.get(),
                                       nullptr),
               "flash_attention_forward (bf16)");
    check_cuda(cast_to_bf16(out.get(), ld_out, out_b.get(), ld_out, rows, ld_out, nullptr),
               "cast_to_bf16");
    check_cuda(
        flash_attention_backward(dims, {dout_b.get(), ld_out}, {out_b.get(), ld_out}, {q_b, ld},
                                 {q_b + batch.k_offset(), ld}, {q_b + batch.v_offset(), ld},
                                 lse.get(), delta.get(), {dq, ld}, {dk, ld}, {dv, ld}, nullptr),
        "flash_attention_backward (bf16)");
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return {out.download(), lse.download(), dqkv.download()};
}

// One tensor inside a row-major buffer: `heads` heads of head_dim columns from column `first`.
struct TensorView {
  const char* name;
  std::size_t ld, first, heads;
};

struct Errors {
  double relative_frobenius = 0;  // ‖actual - expected‖ / ‖expected‖
  double max_over_scale = 0;      // max |actual - expected| / max |expected|
  double worst_row = 0;  // max over (row, head) of ‖Δ‖ / (‖expected‖ + half the mean)
  bool finite = true;    // no NaN (unwritten) or infinity in `actual`
};

inline Errors compare(const std::vector<float>& actual, const std::vector<float>& expected,
                      TensorView view, std::size_t rows, std::size_t head_dim) {
  Errors e;
  double diff_sq = 0, ref_sq = 0, max_diff = 0, scale = 0, norm_sum = 0;
  std::vector<double> row_diff, row_norm;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t h = 0; h < view.heads; ++h) {
      double d_sq = 0, n_sq = 0;
      for (std::size_t c = 0; c < head_dim; ++c) {
        const std::size_t i = r * view.ld + view.first + h * head_dim + c;
        const double a = actual[i];
        const double x = expected[i];
        e.finite = e.finite && std::isfinite(a);
        d_sq += (a - x) * (a - x);
        n_sq += x * x;
        max_diff = std::max(max_diff, std::abs(a - x));
        scale = std::max(scale, std::abs(x));
      }
      diff_sq += d_sq;
      ref_sq += n_sq;
      row_diff.push_back(std::sqrt(d_sq));
      row_norm.push_back(std::sqrt(n_sq));
      norm_sum += row_norm.back();
    }
  }
  if (!e.finite) {
    const double inf = std::numeric_limits<double>::infinity();
    return {inf, inf, inf, false};
  }
  e.relative_frobenius = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  e.max_over_scale = scale > 0 ? max_diff / scale : max_diff;
  const double floor =
      0.5 * norm_sum / static_cast<double>(std::max<std::size_t>(1, row_norm.size()));
  for (std::size_t i = 0; i < row_norm.size(); ++i) {
    e.worst_row = std::max(e.worst_row, row_diff[i] / (row_norm[i] + floor));
  }
  return e;
}

}  // namespace strata::llm::cuda::testing
