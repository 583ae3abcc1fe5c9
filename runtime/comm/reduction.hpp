// Reductions of the communicators over DType elements (base/dtype.hpp). 16-bit floats (bf16, fp16)
// travel as raw bits; every reduction widens to fp32, accumulates the ranks' contributions in rank
// order (0, 1, ..., N-1) and rounds to nearest even once at the end (base/float16.hpp), so a result
// depends only on the inputs and N, never on the transport, the algorithm or the thread count.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/dtype.hpp"

namespace strata::runtime::comm {

enum class ReduceOp : std::uint8_t { kSum, kAvg, kMax };

std::string_view to_string(ReduceOp op);
// kAvg is defined for floating types only; kSum on integers wraps modulo 2^bits.
bool is_valid_reduction(DType dtype, ReduceOp op);

// The C++ types the typed collective overloads accept: float, Bf16, Fp16, uint8_t, uint64_t.
template <typename T>
concept CommElement = is_element_v<T>;

// reduce_rows: out[i] = op(rows[0][i], rows[1][i], ..., rows[N-1][i]) over `count` elements of
// `dtype`, the rows taken in the order given (the callers pass them in rank order). Floating types
// accumulate in fp32 and round once; kAvg divides the fp32 sum by N before rounding; kMax of a NaN
// is NaN. Row i starts at rows_base + i * row_stride_bytes. `out` may alias row 0 (not the others).
void reduce_rows(DType dtype, ReduceOp op, const std::byte* rows_base,
                 std::size_t row_stride_bytes, std::size_t row_count, std::size_t count,
                 std::byte* out);

}  // namespace strata::runtime::comm
