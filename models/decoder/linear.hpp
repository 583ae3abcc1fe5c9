// Matrix products of the decoder's projections on the host (OpenBLAS sgemm through
// strata::gpt::detail::gemm). Row-major; every buffer has a row stride (ld*) so q, k and v can
// live side by side in one [rows × (q + 2·kv)] buffer, and gate and up in one [rows × 2·inner].
//   Layout::kOutIn: HF nn.Linear, weight [out, in], y = x·Wᵀ + b (Llama, Mistral, Qwen2)
//   Layout::kInOut: HF Conv1D,    weight [in, out], y = x·W + b  (GPT-2)
// Bias gradients sum rows in order on one thread: bitwise the same for any thread count.
//
// Bf16OperandsScope makes every product here (and the decoder's head products, which go through
// product()) round both operands to bf16, round to nearest even, before an fp32 sgemm: exactly
// what the CUDA backend's tensor-core products compute, up to summation order. The tests use it
// to tell a bf16 bug apart from bf16 rounding (DecoderOptions::host_bf16_operands). Per thread.
#pragma once

#include <cstddef>

#include "models/gpt/kernels.hpp"

namespace strata::llm::detail {

enum class Layout : unsigned char { kOutIn, kInOut };
enum class Accumulate : unsigned char { kNo, kYes };

struct Strided {
  float* data;
  std::size_t ld;  // floats between consecutive rows
};
struct ConstStrided {
  const float* data;
  std::size_t ld;
};

class Bf16OperandsScope {
 public:
  explicit Bf16OperandsScope(bool active);
  ~Bf16OperandsScope();
  Bf16OperandsScope(const Bf16OperandsScope&) = delete;
  Bf16OperandsScope& operator=(const Bf16OperandsScope&) = delete;

 private:
  bool previous_;
};

// gpt::detail::gemm's contract (row-major C = alpha·op(A)·op(B) + beta·C), with A and B rounded
// to bf16 first inside a Bf16OperandsScope.
void product(gpt::detail::Transpose op_a, gpt::detail::Transpose op_b, std::size_t m,
             std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
             const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc);

// y = x·op(W) (+ bias when not null); y's rows are overwritten.
void linear_forward(Layout layout, ConstStrided x, const float* weight, const float* bias,
                    Strided y, std::size_t rows, std::size_t in, std::size_t out);
// dx = dy·op(W)ᵀ (added to dx when accumulate_dx), dweight = its gradient (overwritten),
// dbias = Σ_rows dy (overwritten; skipped when null).
void linear_backward(Layout layout, ConstStrided dy, ConstStrided x, const float* weight,
                     Strided dx, float* dweight, float* dbias, std::size_t rows, std::size_t in,
                     std::size_t out, Accumulate accumulate_dx);

}  // namespace strata::llm::detail
