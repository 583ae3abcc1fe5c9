// Matrix products of the decoder's projections on the host (OpenBLAS sgemm through
// strata::gpt::detail::gemm). Row-major; every buffer has a row stride (ld*) so q, k and v can
// live side by side in one [rows × (q + 2·kv)] buffer, and gate and up in one [rows × 2·inner].
//   Layout::kOutIn: HF nn.Linear, weight [out, in], y = x·Wᵀ + b (Llama, Mistral, Qwen2)
//   Layout::kInOut: HF Conv1D,    weight [in, out], y = x·W + b  (GPT-2)
// Bias gradients sum rows in order on one thread: bitwise the same for any thread count.
#pragma once

#include <cstddef>

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

// y = x·op(W) (+ bias when not null); y's rows are overwritten.
void linear_forward(Layout layout, ConstStrided x, const float* weight, const float* bias,
                    Strided y, std::size_t rows, std::size_t in, std::size_t out);
// dx = dy·op(W)ᵀ (added to dx when accumulate_dx), dweight = its gradient (overwritten),
// dbias = Σ_rows dy (overwritten; skipped when null).
void linear_backward(Layout layout, ConstStrided dy, ConstStrided x, const float* weight,
                     Strided dx, float* dweight, float* dbias, std::size_t rows, std::size_t in,
                     std::size_t out, Accumulate accumulate_dx);

}  // namespace strata::llm::detail
