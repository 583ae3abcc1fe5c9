// The block codecs of state_format.hpp, written once over an Ops type like the update rules (tails
// through ScalarOps with the same operation sequence, so every SIMD level gives the same bytes).
// Include only from kernel_impl.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_adam/detail/vector_ops.hpp"
#include "cpu_adam/state_format.hpp"

namespace strata::cpu_adam::detail {
namespace {

// The square of the largest signed code, and the largest non-negative code.
inline constexpr float kSignedSquare = 127.0f * 127.0f;
inline constexpr float kSignedMax = 127.0f;
inline constexpr float kUnsignedMax = 255.0f;

template <class V>
float block_absmax(const float* values, std::size_t n) {
  // max is exact, so the lane layout cannot change the result (NaN-free input).
  std::size_t i = 0;
  float best = 0.0f;
  if constexpr (V::kWidth > 1) {
    typename V::F lanes(0.0f);
    for (; i + V::kWidth <= n; i += V::kWidth) lanes = V::max(lanes, V::abs(V::load(values + i)));
    best = V::reduce_max(lanes);
  }
  for (; i < n; ++i) best = ScalarOps::max(best, ScalarOps::abs(values[i]));
  return best;
}

struct SignedCode {  // exp_avg: value = scale * q|q| / 127^2
  using Code = std::int8_t;
  template <class Ops>
  static typename Ops::F decode(const Code* code, typename Ops::F scale) {
    using F = typename Ops::F;
    const F q = Ops::load(code);
    return scale * ((q * Ops::abs(q)) / F(kSignedSquare));
  }
  template <class Ops>
  static void encode(Code* code, typename Ops::F value, typename Ops::F inverse_scale) {
    using F = typename Ops::F;
    const F position = Ops::sqrt(Ops::abs(value) * inverse_scale) * F(kSignedMax);
    const F magnitude = Ops::min(position + F(0.5f), F(kSignedMax));
    Ops::store_truncated(code, Ops::sign(value) * magnitude);  // truncation is sign-symmetric
  }
};

struct UnsignedCode {  // exp_avg_sq: value = scale * (c / 255)^4
  using Code = std::uint8_t;
  template <class Ops>
  static typename Ops::F decode(const Code* code, typename Ops::F scale) {
    using F = typename Ops::F;
    const F t = Ops::load(code) / F(kUnsignedMax);
    const F t2 = t * t;
    return scale * (t2 * t2);
  }
  template <class Ops>
  static void encode(Code* code, typename Ops::F value, typename Ops::F inverse_scale) {
    using F = typename Ops::F;
    const F position = Ops::sqrt(Ops::sqrt(value * inverse_scale)) * F(kUnsignedMax);
    Ops::store_truncated(code, Ops::min(position + F(0.5f), F(kUnsignedMax)));
  }
};

// One block (n <= kQuantBlockElems values) to its kQuantBlockBytes bytes, and back.
template <class V, class Code>
void encode_block(const float* values, std::size_t n, std::byte* block) {
  const float scale = block_absmax<V>(values, n);
  std::memcpy(block, &scale, sizeof(float));
  auto* codes = reinterpret_cast<typename Code::Code*>(block + sizeof(float));
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    Code::template encode<V>(codes + i, V::load(values + i), typename V::F(inverse));
  }
  for (; i < n; ++i) Code::template encode<ScalarOps>(codes + i, values[i], inverse);
  std::memset(codes + n, 0, kQuantBlockElems - n);
}

template <class V, class Code>
void decode_block(const std::byte* block, std::size_t n, float* values) {
  float scale;
  std::memcpy(&scale, block, sizeof(float));
  const auto* codes = reinterpret_cast<const typename Code::Code*>(block + sizeof(float));
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    V::store(values + i, Code::template decode<V>(codes + i, typename V::F(scale)));
  }
  for (; i < n; ++i) values[i] = Code::template decode<ScalarOps>(codes + i, scale);
}

// Elements [begin, begin + n) of a moment in `dtype` into fp32 values[0, n), and back. For int8,
// begin is a block start and n at most one block.
template <class V>
void decode_moment(StateDType dtype, MomentKind moment, const std::byte* state, std::size_t begin,
                   std::size_t n, float* values) {
  switch (dtype) {
    case StateDType::kFp32:
      std::memcpy(values, state + begin * sizeof(float), n * sizeof(float));
      return;
    case StateDType::kBf16: {
      const Bf16* from = reinterpret_cast<const Bf16*>(state) + begin;
      std::size_t i = 0;
      for (; i + V::kWidth <= n; i += V::kWidth) V::store(values + i, V::load(from + i));
      for (; i < n; ++i) values[i] = ScalarOps::load(from + i);
      return;
    }
    case StateDType::kInt8: {
      const std::byte* block = state + begin / kQuantBlockElems * kQuantBlockBytes;
      if (moment == MomentKind::kExpAvg) {
        decode_block<V, SignedCode>(block, n, values);
      } else {
        decode_block<V, UnsignedCode>(block, n, values);
      }
      return;
    }
  }
}

template <class V>
void encode_moment(StateDType dtype, MomentKind moment, const float* values, std::size_t begin,
                   std::size_t n, std::byte* state) {
  switch (dtype) {
    case StateDType::kFp32:
      std::memcpy(state + begin * sizeof(float), values, n * sizeof(float));
      return;
    case StateDType::kBf16: {
      Bf16* to = reinterpret_cast<Bf16*>(state) + begin;
      std::size_t i = 0;
      for (; i + V::kWidth <= n; i += V::kWidth) V::store(to + i, V::load(values + i));
      for (; i < n; ++i) ScalarOps::store(to + i, values[i]);
      return;
    }
    case StateDType::kInt8: {
      std::byte* block = state + begin / kQuantBlockElems * kQuantBlockBytes;
      if (moment == MomentKind::kExpAvg) {
        encode_block<V, SignedCode>(values, n, block);
      } else {
        encode_block<V, UnsignedCode>(values, n, block);
      }
      return;
    }
  }
}

// Stochastic rounding of fp32 to bf16: add 16 random bits below the kept ones and cut them off,
// so the result rounds up with probability (distance to the lower bf16) / (bf16 spacing).
// Non-finite values round to nearest (NaNs stay NaN). Integer arithmetic only: exact anywhere.
inline std::uint64_t rounding_key(std::uint64_t seed, std::uint64_t step) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + step;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

inline std::uint32_t rounding_noise(std::uint64_t key, std::uint64_t element) {
  std::uint64_t x = key ^ (element * 0xD1B54A32D192ED03ull);
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return static_cast<std::uint32_t>(x);
}

inline Bf16 round_stochastic(float value, std::uint32_t noise) {
  const std::uint32_t bits = strata::detail::float_bits(value);
  if ((bits & 0x7F80'0000u) == 0x7F80'0000u) return to_bf16(value);
  return Bf16{static_cast<std::uint16_t>((bits + (noise & 0xFFFFu)) >> 16)};
}

}  // namespace
}  // namespace strata::cpu_adam::detail
