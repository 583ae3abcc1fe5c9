// Typed views of host memory for the CPU optimizer: `count` elements of a floating DType (fp32,
// bf16, fp16; base/dtype.hpp). The element type and its conversions are base/'s, shared by every
// layer, so the SIMD kernels here are tested bit for bit against the same scalar conversions the
// device kernels and the communicators use.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "base/assert.hpp"
#include "base/dtype.hpp"

namespace strata::cpu_adam {

// The kernel tables are indexed by the floating DTypes, which come first in DType.
inline constexpr int kDtypeCount = kFloatDTypeCount;

// A view of `count` elements of `dtype` in host memory (non-owning). Null data means "absent",
// which is how optional outputs are passed. Only floating dtypes: the kernels know no others.
struct TypedSpan {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::kFp32;

  TypedSpan() = default;
  TypedSpan(void* data_in, std::size_t count_in, DType dtype_in)
      : data(data_in), count(count_in), dtype(dtype_in) {
    STRATA_ASSERT(is_floating_point(dtype), "the CPU optimizer works on fp32, bf16 or fp16");
  }
  template <class T>
  TypedSpan(std::span<T> values)  // NOLINT(google-explicit-constructor): a span is a typed span
      : data(values.data()), count(values.size()), dtype(dtype_v<T>) {
    static_assert(is_floating_point(dtype_v<T>), "float, Bf16 or Fp16 elements only");
  }

  bool present() const { return data != nullptr; }
  std::size_t size_bytes() const { return count * dtype_bytes(dtype); }
};

struct ConstTypedSpan {
  const void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::kFp32;

  ConstTypedSpan() = default;
  ConstTypedSpan(const void* data_in, std::size_t count_in, DType dtype_in)
      : data(data_in), count(count_in), dtype(dtype_in) {
    STRATA_ASSERT(is_floating_point(dtype), "the CPU optimizer works on fp32, bf16 or fp16");
  }
  template <class T>
  ConstTypedSpan(std::span<T> values)  // NOLINT(google-explicit-constructor)
      : data(values.data()), count(values.size()), dtype(dtype_v<std::remove_const_t<T>>) {
    static_assert(is_floating_point(dtype_v<std::remove_const_t<T>>),
                  "float, Bf16 or Fp16 elements only");
  }
  ConstTypedSpan(TypedSpan span)  // NOLINT(google-explicit-constructor)
      : data(span.data), count(span.count), dtype(span.dtype) {}

  bool present() const { return data != nullptr; }
  std::size_t size_bytes() const { return count * dtype_bytes(dtype); }
};

}  // namespace strata::cpu_adam
