#include "examples/llm/linear.hpp"

#include <algorithm>

#include "examples/gpt/kernels.hpp"

namespace strata::llm::detail {
namespace {

using gpt::detail::gemm;
using gpt::detail::Transpose;

}  // namespace

void linear_forward(Layout layout, ConstStrided x, const float* weight, const float* bias,
                    Strided y, std::size_t rows, std::size_t in, std::size_t out) {
  float beta = 0.0f;
  if (bias != nullptr) {
    for (std::size_t r = 0; r < rows; ++r) std::copy(bias, bias + out, y.data + r * y.ld);
    beta = 1.0f;
  }
  if (layout == Layout::kOutIn) {
    gemm(Transpose::kNo, Transpose::kYes, rows, out, in, 1.0f, x.data, x.ld, weight, in, beta,
         y.data, y.ld);
  } else {
    gemm(Transpose::kNo, Transpose::kNo, rows, out, in, 1.0f, x.data, x.ld, weight, out, beta,
         y.data, y.ld);
  }
}

void linear_backward(Layout layout, ConstStrided dy, ConstStrided x, const float* weight,
                     Strided dx, float* dweight, float* dbias, std::size_t rows, std::size_t in,
                     std::size_t out, Accumulate accumulate_dx) {
  const float dx_beta = accumulate_dx == Accumulate::kYes ? 1.0f : 0.0f;
  if (layout == Layout::kOutIn) {
    // dx = dy·W, dW = dyᵀ·x.
    gemm(Transpose::kNo, Transpose::kNo, rows, in, out, 1.0f, dy.data, dy.ld, weight, in, dx_beta,
         dx.data, dx.ld);
    gemm(Transpose::kYes, Transpose::kNo, out, in, rows, 1.0f, dy.data, dy.ld, x.data, x.ld, 0.0f,
         dweight, in);
  } else {
    // dx = dy·Wᵀ, dW = xᵀ·dy.
    gemm(Transpose::kNo, Transpose::kYes, rows, in, out, 1.0f, dy.data, dy.ld, weight, out,
         dx_beta, dx.data, dx.ld);
    gemm(Transpose::kYes, Transpose::kNo, in, out, rows, 1.0f, x.data, x.ld, dy.data, dy.ld, 0.0f,
         dweight, out);
  }
  if (dbias != nullptr) {
    std::fill(dbias, dbias + out, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = dy.data + r * dy.ld;
      for (std::size_t c = 0; c < out; ++c) dbias[c] += row[c];
    }
  }
}

}  // namespace strata::llm::detail
