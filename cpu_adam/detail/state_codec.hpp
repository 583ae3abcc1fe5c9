// The block codecs of state_format.hpp, written once over an Ops type like the update rules (tails
// through ScalarOps with the same operation sequence, so every SIMD level gives the same bytes).
// Include only from kernel_impl.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>

#include "cpu_adam/detail/vector_ops.hpp"
#include "cpu_adam/state_format.hpp"

namespace strata::cpu_adam::detail {
namespace {

template <class V>
float block_absmax(const float* values, std::size_t n) {
  // max is exact, so the lane layout cannot change the result (NaN-free input). Four
  // accumulators: one would wait on its compare-and-select chain every vector.
  std::size_t i = 0;
  float best = 0.0f;
  if constexpr (V::kWidth > 1) {
    using F = typename V::F;
    F lanes0(0.0f), lanes1(0.0f), lanes2(0.0f), lanes3(0.0f);
    for (; i + 4 * V::kWidth <= n; i += 4 * V::kWidth) {
      lanes0 = V::max(lanes0, V::abs(V::load(values + i)));
      lanes1 = V::max(lanes1, V::abs(V::load(values + i + V::kWidth)));
      lanes2 = V::max(lanes2, V::abs(V::load(values + i + 2 * V::kWidth)));
      lanes3 = V::max(lanes3, V::abs(V::load(values + i + 3 * V::kWidth)));
    }
    for (; i + V::kWidth <= n; i += V::kWidth) lanes0 = V::max(lanes0, V::abs(V::load(values + i)));
    best = V::reduce_max(V::max(V::max(lanes0, lanes1), V::max(lanes2, lanes3)));
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
    return scale * ((q * Ops::abs(q)) * F(kSignedCodeInverseSquare));
  }
  template <class Ops>
  static void encode(Code* code, typename Ops::F value, typename Ops::F inverse_scale) {
    using F = typename Ops::F;
    const F position = Ops::sqrt(Ops::abs(value) * inverse_scale) * F(kSignedCodeMax);
    const F magnitude = Ops::min(position + F(0.5f), F(kSignedCodeMax));
    // Truncation is sign-symmetric; a zero value has magnitude 0.5, which truncates to code 0
    // whatever sign it is given.
    Ops::store_truncated(code, Ops::copysign(magnitude, value));
  }
};

struct UnsignedCode {  // exp_avg_sq: value = scale * (c / 255)^4
  using Code = std::uint8_t;
  template <class Ops>
  static typename Ops::F decode(const Code* code, typename Ops::F scale) {
    using F = typename Ops::F;
    const F t = Ops::load(code) * F(kUnsignedCodeInverse);
    const F t2 = t * t;
    return scale * (t2 * t2);
  }
  template <class Ops>
  static void encode(Code* code, typename Ops::F value, typename Ops::F inverse_scale) {
    using F = typename Ops::F;
    const F position = Ops::sqrt(Ops::sqrt(value * inverse_scale)) * F(kUnsignedCodeMax);
    Ops::store_truncated(code, Ops::min(position + F(0.5f), F(kUnsignedCodeMax)));
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

// UnsignedCode's block from the values and their square roots (which the update computed anyway):
// (v / scale)^(1/4) * 255 = sqrt(sqrt(v)) * (255 / scale^(1/4)), the factor once per block in
// double, so each element takes one sqrt instead of two. The position differs from encode's by a
// few ulp, which can only move a value within a few ulp of a code boundary to the other of its two
// bracketing codes; the scale is the same absmax.
template <class V>
void encode_root_block(const float* values, const float* roots, std::size_t n, std::byte* block) {
  const float scale = block_absmax<V>(values, n);
  std::memcpy(block, &scale, sizeof(float));
  auto* codes = reinterpret_cast<std::uint8_t*>(block + sizeof(float));
  const float factor =
      scale > 0.0f
          ? static_cast<float>(255.0 / __builtin_sqrt(__builtin_sqrt(static_cast<double>(scale))))
          : 0.0f;
  using F = typename V::F;
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const F position = V::sqrt(V::load(roots + i)) * F(factor);
    V::store_truncated(codes + i, V::min(position + F(0.5f), F(kUnsignedCodeMax)));
  }
  for (; i < n; ++i) {
    const float position = ScalarOps::sqrt(roots[i]) * factor;
    ScalarOps::store_truncated(codes + i, ScalarOps::min(position + 0.5f, kUnsignedCodeMax));
  }
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

// n fp32 master values of elements first_element.. rounded stochastically into kept[0, n). The
// lanes of a vector share the first element's high word up to the next multiple of 2^32; past it
// (at most once in 2^32 elements) the block ends element by element, so each element gets its
// noise whatever the level.
template <class V>
void round_master(std::uint64_t key, std::uint64_t first_element, const float* values,
                  std::size_t n, Bf16* kept) {
  const std::uint32_t high_key = rounding_high_key(key, first_element);
  const auto first_low = static_cast<std::uint32_t>(first_element);
  const std::uint64_t same_high =
      std::uint64_t{std::numeric_limits<std::uint32_t>::max()} - first_low + 1;
  const auto vector_end = static_cast<std::size_t>(std::min<std::uint64_t>(n, same_high));
  std::size_t i = 0;
  for (; i + V::kWidth <= vector_end; i += V::kWidth) {
    V::store_stochastic(kept + i, V::load(values + i), high_key,
                        first_low + static_cast<std::uint32_t>(i));
  }
  for (; i < n; ++i) {
    const std::uint64_t element = first_element + i;
    ScalarOps::store_stochastic(kept + i, values[i], rounding_high_key(key, element),
                                static_cast<std::uint32_t>(element));
  }
}

// A Kahan-compensated bf16 master (CompressedSpans::compensation): the value is weight + low,
// summed in fp32 (exact: low is at most half of weight's last place, so the sum needs 16
// significant bits); a zero low leaves the weight as it is, the sign of a zero included
// (Ops::add_nonzero; kernel_impl.hpp's load_master, state_format.cpp's add_compensation).
// The split back: weight = the value rounded to nearest even bf16, low = what that lost (exact in
// fp32) cut toward zero to bf16. Cutting toward zero makes the split a fixed point: |low| reaches
// half of weight's last place only when the value was that tie itself, so weight + low rounds to
// weight again, and a split of join(weight, low) gives back the same two (a checkpoint stores the
// joined value). A zero low is +0, and a non-finite value keeps low = +0.
template <class V>
void split_compensated(const float* values, std::size_t n, Bf16* weight, Bf16* low) {
  std::size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const typename V::F x = V::load(values + i);
    V::store(weight + i, x);
    const typename V::F residual = x - V::load(weight + i);
    V::store(low + i, V::truncate_bf16(V::nan_to_zero(residual)) + typename V::F(0.0f));
  }
  for (; i < n; ++i) {
    ScalarOps::store(weight + i, values[i]);
    const float residual = values[i] - ScalarOps::load(weight + i);
    ScalarOps::store(low + i, ScalarOps::truncate_bf16(ScalarOps::nan_to_zero(residual)) + 0.0f);
  }
}

}  // namespace
}  // namespace strata::cpu_adam::detail
