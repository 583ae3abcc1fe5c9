// Shared helpers for the cpu_adam tests: seeds, typed buffers, comparisons.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/debug_knobs.hpp"
#include "cpu_adam/typed_span.hpp"
#include "cpu_adam/simd_level.hpp"
#include "tests/base/float16_reference.hpp"

namespace strata::cpu_adam::testing {

// STRATA_TEST_SEED overrides the default seed; tests print the seed they used on failure.
inline std::uint64_t test_seed(std::uint64_t fallback) {
  return test_seed_knob().value_or(fallback);
}

inline std::string seed_note(std::uint64_t seed) {
  return "seed=" + std::to_string(seed) + " (rerun with STRATA_TEST_SEED=" + std::to_string(seed) +
         ")";
}

// Equal bits, or both NaN (NaN payloads may legitimately depend on operand order).
inline bool same_value(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Raw bytes holding `count` elements of `dtype`, starting `offset_elems` elements into a 64-byte
// aligned allocation (so tests can exercise unaligned starts).
class TypedBuffer {
 public:
  static constexpr unsigned char kGuard = 0xA5;
  static constexpr std::uint64_t kGuardWord = 0xA5A5'A5A5'A5A5'A5A5ull;

  TypedBuffer(DType dtype, std::size_t count, std::size_t offset_elems = 0)
      : dtype_(dtype), count_(count), offset_bytes_(offset_elems * dtype_bytes(dtype)) {
    // Every byte outside the span holds kGuard, so guards_intact() catches stray vector writes.
    storage_.resize((offset_bytes_ + count * dtype_bytes(dtype) + 64) / 8 + 8, kGuardWord);
    base_ = reinterpret_cast<unsigned char*>(storage_.data());
    base_ += (64 - reinterpret_cast<std::uintptr_t>(base_) % 64) % 64;
  }

  bool guards_intact() const {
    const auto* first = reinterpret_cast<const unsigned char*>(storage_.data());
    const auto* last = first + storage_.size() * sizeof(std::uint64_t);
    const unsigned char* begin = static_cast<const unsigned char*>(data());
    const unsigned char* end = begin + count_ * dtype_bytes(dtype_);
    for (const unsigned char* p = first; p < begin; ++p) {
      if (*p != kGuard) return false;
    }
    for (const unsigned char* p = end; p < last; ++p) {
      if (*p != kGuard) return false;
    }
    return true;
  }
  void* data() { return base_ + offset_bytes_; }
  const void* data() const { return base_ + offset_bytes_; }
  TypedSpan span() { return TypedSpan(data(), count_, dtype_); }
  ConstTypedSpan cspan() const { return ConstTypedSpan(data(), count_, dtype_); }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }

  void set(std::size_t i, float value) {
    switch (dtype_) {
      case DType::kFp32:
        std::memcpy(at(i), &value, 4);
        break;
      case DType::kBf16: {
        const Bf16 v = to_bf16(value);
        std::memcpy(at(i), &v, 2);
        break;
      }
      case DType::kFp16: {
        const Fp16 v = to_fp16(value);
        std::memcpy(at(i), &v, 2);
        break;
      }
      case DType::kUint8:
      case DType::kUint64:
        break;  // TypedSpan holds floating types only
    }
  }
  float get(std::size_t i) const {
    switch (dtype_) {
      case DType::kFp32: {
        float v;
        std::memcpy(&v, at(i), 4);
        return v;
      }
      case DType::kBf16: {
        Bf16 v;
        std::memcpy(&v, at(i), 2);
        return to_float(v);
      }
      case DType::kFp16: {
        Fp16 v;
        std::memcpy(&v, at(i), 2);
        return to_float(v);
      }
      case DType::kUint8:
      case DType::kUint64:
        break;  // TypedSpan holds floating types only
    }
    return 0;
  }
  std::uint32_t bits(std::size_t i) const {
    std::uint32_t v = 0;
    std::memcpy(&v, at(i), dtype_bytes(dtype_));
    return v;
  }
  bool same_bytes(const TypedBuffer& other) const {
    return count_ == other.count_ &&
           (count_ == 0 || std::memcmp(data(), other.data(), count_ * dtype_bytes(dtype_)) == 0);
  }

 private:
  unsigned char* at(std::size_t i) { return base_ + offset_bytes_ + i * dtype_bytes(dtype_); }
  const unsigned char* at(std::size_t i) const {
    return base_ + offset_bytes_ + i * dtype_bytes(dtype_);
  }

  DType dtype_;
  std::size_t count_;
  std::size_t offset_bytes_;
  std::vector<std::uint64_t> storage_;
  unsigned char* base_ = nullptr;
};

// A gradient-like value: random sign, magnitude 2^[min_exp, max_exp), and now and then an edge
// value (zeros, denormals, the smallest normal, very large and very small magnitudes).
inline float random_value(std::mt19937_64& rng, int min_exp, int max_exp, bool edges) {
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::uniform_int_distribution<int> exponent(min_exp, max_exp - 1);
  std::uniform_int_distribution<int> pick(0, 39);
  const float sign = (rng() & 1) != 0 ? -1.0f : 1.0f;
  if (edges) {
    switch (pick(rng)) {
      case 0:
        return 0.0f;
      case 1:
        return -0.0f;
      case 2:
        return sign * 1e-40f;  // denormal
      case 3:
        return sign * 1.17549435e-38f;  // FLT_MIN
      case 4:
        return sign * 1e-30f;
      case 5:
        return sign * 1e18f;  // g*g still fits fp32
      default:
        break;
    }
  }
  return sign * std::ldexp(mantissa(rng), exponent(rng));
}

// Round-to-nearest-even to bf16 by comparing distances in double: independent of the bit trick
// that to_bf16() and the kernels use.
using float16_reference::reference_bf16_bits;

inline const char* level_name(SimdLevel level) {
  return simd_level_name(level).data();
}

}  // namespace strata::cpu_adam::testing
