#include "runtime/comm/reduction.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/assert.hpp"

namespace strata::runtime::comm {

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

bool is_valid_reduction(DType dtype, ReduceOp op) {
  return is_floating_point(dtype) || op != ReduceOp::kAvg;
}

namespace {

// Elements are processed in blocks so the inner loops run over contiguous memory and vectorise.
constexpr std::size_t kBlockElements = 512;

// std::max (the first operand on ties, so -0/+0 follow rank order), except that a NaN wins: an
// overflow check must see it.
float max_keeping_nan(float accumulated, float value) {
  if (std::isnan(value)) return value;
  return accumulated < value ? value : accumulated;
}

template <typename T>
float load_as_float(const std::byte* address) {
  T element;
  std::memcpy(&element, address, sizeof(T));
  if constexpr (std::same_as<T, float>) {
    return element;
  } else {
    return to_float(element);
  }
}

template <typename T>
void store_from_float(float value, std::byte* address) {
  T element;
  if constexpr (std::same_as<T, float>) {
    element = value;
  } else if constexpr (std::same_as<T, Bf16>) {
    element = to_bf16(value);
  } else {
    element = to_fp16(value);
  }
  std::memcpy(address, &element, sizeof(T));
}

template <typename T>
void reduce_floating(ReduceOp op, const std::byte* rows_base, std::size_t row_stride_bytes,
                     std::size_t row_count, std::size_t count, std::byte* out) {
  float accumulator[kBlockElements];
  for (std::size_t begin = 0; begin < count; begin += kBlockElements) {
    const std::size_t block = std::min(kBlockElements, count - begin);
    const std::byte* row0 = rows_base + begin * sizeof(T);
    for (std::size_t i = 0; i < block; ++i) accumulator[i] = load_as_float<T>(row0 + i * sizeof(T));
    for (std::size_t row = 1; row < row_count; ++row) {
      const std::byte* source = rows_base + row * row_stride_bytes + begin * sizeof(T);
      if (op == ReduceOp::kMax) {
        for (std::size_t i = 0; i < block; ++i) {
          accumulator[i] =
              max_keeping_nan(accumulator[i], load_as_float<T>(source + i * sizeof(T)));
        }
      } else {
        for (std::size_t i = 0; i < block; ++i)
          accumulator[i] += load_as_float<T>(source + i * sizeof(T));
      }
    }
    if (op == ReduceOp::kAvg) {
      const auto ranks = static_cast<float>(row_count);
      for (std::size_t i = 0; i < block; ++i) accumulator[i] /= ranks;
    }
    std::byte* target = out + begin * sizeof(T);
    for (std::size_t i = 0; i < block; ++i)
      store_from_float<T>(accumulator[i], target + i * sizeof(T));
  }
}

template <typename T>
void reduce_integer(ReduceOp op, const std::byte* rows_base, std::size_t row_stride_bytes,
                    std::size_t row_count, std::size_t count, std::byte* out) {
  for (std::size_t i = 0; i < count; ++i) {
    T accumulated;
    std::memcpy(&accumulated, rows_base + i * sizeof(T), sizeof(T));
    for (std::size_t row = 1; row < row_count; ++row) {
      T value;
      std::memcpy(&value, rows_base + row * row_stride_bytes + i * sizeof(T), sizeof(T));
      accumulated =
          op == ReduceOp::kMax ? std::max(accumulated, value) : static_cast<T>(accumulated + value);
    }
    std::memcpy(out + i * sizeof(T), &accumulated, sizeof(T));
  }
}

}  // namespace

void reduce_rows(DType dtype, ReduceOp op, const std::byte* rows_base,
                 std::size_t row_stride_bytes, std::size_t row_count, std::size_t count,
                 std::byte* out) {
  STRATA_ASSERT(row_count > 0);
  STRATA_ASSERT(is_valid_reduction(dtype, op), "kAvg is defined for floating types only");
  switch (dtype) {
    case DType::kFp32:
      return reduce_floating<float>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DType::kBf16:
      return reduce_floating<Bf16>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DType::kFp16:
      return reduce_floating<Fp16>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DType::kUint8:
      return reduce_integer<std::uint8_t>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DType::kUint64:
      return reduce_integer<std::uint64_t>(op, rows_base, row_stride_bytes, row_count, count, out);
  }
}

}  // namespace strata::runtime::comm
