// Element types and reductions of the communicators. 16-bit floats (bf16, fp16) travel as raw bits;
// every reduction widens to fp32, accumulates the ranks' contributions in rank order (0, 1, ...,
// N-1) and rounds to nearest even once at the end, so a result depends only on the inputs and N,
// never on the transport, the algorithm or the thread count.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace strata::runtime::comm {

enum class DataType : std::uint8_t { kFp32, kBf16, kFp16, kUint8, kUint64 };
enum class ReduceOp : std::uint8_t { kSum, kAvg, kMax };

std::string_view to_string(DataType dtype);
std::string_view to_string(ReduceOp op);
std::size_t element_bytes(DataType dtype);
// kAvg is defined for floating types only; kSum on integers wraps modulo 2^bits.
bool is_valid_reduction(DataType dtype, ReduceOp op);

// bf16 and fp16 as raw bit patterns: the communicators move and reduce them, nothing else.
struct BFloat16 {
  std::uint16_t bits = 0;
  friend bool operator==(BFloat16, BFloat16) = default;
};
struct Float16 {
  std::uint16_t bits = 0;
  friend bool operator==(Float16, Float16) = default;
};

// Round-to-nearest-even conversions. NaN stays NaN (quiet), infinities and signed zeros are kept,
// fp16 subnormals are exact both ways; fp32 values beyond the fp16 range become infinity.
BFloat16 to_bf16(float value);
float to_float(BFloat16 value);
Float16 to_fp16(float value);
float to_float(Float16 value);

// The C++ types the typed collective overloads accept, and their wire type.
template <typename T>
concept CommElement = std::same_as<T, float> || std::same_as<T, BFloat16> ||
    std::same_as<T, Float16> || std::same_as<T, std::uint8_t> || std::same_as<T, std::uint64_t>;

template <CommElement T>
constexpr DataType data_type_v = std::same_as<T, float>          ? DataType::kFp32
                                 : std::same_as<T, BFloat16>     ? DataType::kBf16
                                 : std::same_as<T, Float16>      ? DataType::kFp16
                                 : std::same_as<T, std::uint8_t> ? DataType::kUint8
                                                                 : DataType::kUint64;

// reduce_rows: out[i] = op(rows[0][i], rows[1][i], ..., rows[N-1][i]) over `count` elements of
// `dtype`, the rows taken in the order given (the callers pass them in rank order). Floating types
// accumulate in fp32 and round once; kAvg divides the fp32 sum by N before rounding; kMax of a NaN
// is NaN. Row i starts at rows_base + i * row_stride_bytes. `out` may alias row 0 (not the others).
void reduce_rows(DataType dtype, ReduceOp op, const std::byte* rows_base,
                 std::size_t row_stride_bytes, std::size_t row_count, std::size_t count,
                 std::byte* out);

}  // namespace strata::runtime::comm
