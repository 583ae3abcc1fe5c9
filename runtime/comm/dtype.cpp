#include "runtime/comm/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/assert.hpp"

namespace strata::runtime::comm {

std::string_view to_string(DataType dtype) {
  switch (dtype) {
    case DataType::kFp32:
      return "fp32";
    case DataType::kBf16:
      return "bf16";
    case DataType::kFp16:
      return "fp16";
    case DataType::kUint8:
      return "uint8";
    case DataType::kUint64:
      return "uint64";
  }
  return "?";
}

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

std::size_t element_bytes(DataType dtype) {
  switch (dtype) {
    case DataType::kFp32:
      return 4;
    case DataType::kBf16:
    case DataType::kFp16:
      return 2;
    case DataType::kUint8:
      return 1;
    case DataType::kUint64:
      return 8;
  }
  STRATA_ASSERT(false, "unknown DataType");
  return 0;
}

bool is_valid_reduction(DataType dtype, ReduceOp op) {
  const bool integer = dtype == DataType::kUint8 || dtype == DataType::kUint64;
  return !(integer && op == ReduceOp::kAvg);
}

BFloat16 to_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep the sign and top payload, force quiet
    return BFloat16{static_cast<std::uint16_t>((bits >> 16) | 0x0040u)};
  }
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of the
  // mantissa correctly bumps the exponent (and turns the largest finite values into infinity).
  const std::uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>((bits + rounding_bias) >> 16)};
}

float to_float(BFloat16 value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

namespace {

// Shifts `mantissa` right by `shift` bits, rounding to nearest, ties to even.
std::uint32_t shift_round_even(std::uint32_t mantissa, std::uint32_t shift) {
  const std::uint32_t kept = mantissa >> shift;
  const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  return kept + ((remainder > half || (remainder == half && (kept & 1u) != 0)) ? 1u : 0u);
}

}  // namespace

Float16 to_fp16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // infinity or NaN (NaN keeps its top payload bits, forced quiet)
    const std::uint32_t nan_bits =
        magnitude > 0x7f800000u ? 0x0200u | ((magnitude >> 13) & 0x3ffu) : 0;
    return Float16{static_cast<std::uint16_t>(sign | 0x7c00u | nan_bits)};
  }
  if (magnitude >= 0x477ff000u) {  // >= 65520: rounds past the largest finite fp16 (65504)
    return Float16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  }
  const std::uint32_t exponent = magnitude >> 23;
  if (exponent < 113) {    // below 2^-14: fp16 subnormal (units of 2^-24) or zero
    if (exponent < 102) {  // below 2^-25: rounds to zero
      return Float16{sign};
    }
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    // value = mantissa * 2^(exponent - 150) = k * 2^-24  =>  k = mantissa >> (126 - exponent).
    // A carry into 0x400 yields the smallest normal, which is the right encoding.
    return Float16{static_cast<std::uint16_t>(sign | shift_round_even(mantissa, 126 - exponent))};
  }
  // Normal: rebias the exponent (127 -> 15) and round the mantissa from 23 to 10 bits; a carry
  // propagates into the exponent.
  const std::uint32_t unrounded = ((exponent - 112) << 23) | (magnitude & 0x7fffffu);
  return Float16{static_cast<std::uint16_t>(sign | shift_round_even(unrounded, 13))};
}

float to_float(Float16 value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
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
  } else if constexpr (std::same_as<T, BFloat16>) {
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

void reduce_rows(DataType dtype, ReduceOp op, const std::byte* rows_base,
                 std::size_t row_stride_bytes, std::size_t row_count, std::size_t count,
                 std::byte* out) {
  STRATA_ASSERT(row_count > 0);
  STRATA_ASSERT(is_valid_reduction(dtype, op), "kAvg is defined for floating types only");
  switch (dtype) {
    case DataType::kFp32:
      return reduce_floating<float>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DataType::kBf16:
      return reduce_floating<BFloat16>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DataType::kFp16:
      return reduce_floating<Float16>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DataType::kUint8:
      return reduce_integer<std::uint8_t>(op, rows_base, row_stride_bytes, row_count, count, out);
    case DataType::kUint64:
      return reduce_integer<std::uint64_t>(op, rows_base, row_stride_bytes, row_count, count, out);
  }
}

}  // namespace strata::runtime::comm
