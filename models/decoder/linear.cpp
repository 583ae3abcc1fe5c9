#include "models/decoder/linear.hpp"

#include <algorithm>
#include <vector>

#include "base/float16.hpp"
#include "models/gpt/kernels.hpp"

namespace strata::llm::detail {
namespace {

using gpt::detail::Transpose;

thread_local bool bf16_operands = false;

// The [rows × cols] operand at `data` (row stride ld), rounded to bf16 and back, packed.
const float* rounded(const float* data, std::size_t ld, std::size_t rows, std::size_t cols,
                     std::vector<float>& scratch) {
  scratch.resize(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      scratch[r * cols + c] = to_float(to_bf16(data[r * ld + c]));
    }
  }
  return scratch.data();
}

}  // namespace

Bf16OperandsScope::Bf16OperandsScope(bool active) : previous_(bf16_operands) {
  bf16_operands = previous_ || active;
}
Bf16OperandsScope::~Bf16OperandsScope() { bf16_operands = previous_; }

void product(Transpose op_a, Transpose op_b, std::size_t m, std::size_t n, std::size_t k,
             float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
             float beta, float* c, std::size_t ldc) {
  if (!bf16_operands) {
    gpt::detail::gemm(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  thread_local std::vector<float> a_scratch, b_scratch;
  const std::size_t a_rows = op_a == Transpose::kNo ? m : k;
  const std::size_t a_cols = op_a == Transpose::kNo ? k : m;
  const std::size_t b_rows = op_b == Transpose::kNo ? k : n;
  const std::size_t b_cols = op_b == Transpose::kNo ? n : k;
  gpt::detail::gemm(op_a, op_b, m, n, k, alpha, rounded(a, lda, a_rows, a_cols, a_scratch), a_cols,
                    rounded(b, ldb, b_rows, b_cols, b_scratch), b_cols, beta, c, ldc);
}

void linear_forward(Layout layout, ConstStrided x, const float* weight, const float* bias,
                    Strided y, std::size_t rows, std::size_t in, std::size_t out) {
  float beta = 0.0f;
  if (bias != nullptr) {
    for (std::size_t r = 0; r < rows; ++r) std::copy(bias, bias + out, y.data + r * y.ld);
    beta = 1.0f;
  }
  if (layout == Layout::kOutIn) {
    product(Transpose::kNo, Transpose::kYes, rows, out, in, 1.0f, x.data, x.ld, weight, in, beta,
         y.data, y.ld);
  } else {
    product(Transpose::kNo, Transpose::kNo, rows, out, in, 1.0f, x.data, x.ld, weight, out, beta,
         y.data, y.ld);
  }
}

void linear_backward(Layout layout, ConstStrided dy, ConstStrided x, const float* weight,
                     Strided dx, float* dweight, float* dbias, std::size_t rows, std::size_t in,
                     std::size_t out, Accumulate accumulate_dx) {
  const float dx_beta = accumulate_dx == Accumulate::kYes ? 1.0f : 0.0f;
  if (layout == Layout::kOutIn) {
    // dx = dy·W, dW = dyᵀ·x.
    product(Transpose::kNo, Transpose::kNo, rows, in, out, 1.0f, dy.data, dy.ld, weight, in, dx_beta,
         dx.data, dx.ld);
    product(Transpose::kYes, Transpose::kNo, out, in, rows, 1.0f, dy.data, dy.ld, x.data, x.ld, 0.0f,
         dweight, in);
  } else {
    // dx = dy·Wᵀ, dW = xᵀ·dy.
    product(Transpose::kNo, Transpose::kYes, rows, in, out, 1.0f, dy.data, dy.ld, weight, out,
         dx_beta, dx.data, dx.ld);
    product(Transpose::kYes, Transpose::kNo, in, out, rows, 1.0f, x.data, x.ld, dy.data, dy.ld, 0.0f,
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
