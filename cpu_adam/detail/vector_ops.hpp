// Per-instruction-set vector primitives for the kernels: loads of fp32/bf16/fp16 and of the 8-bit
// state codes into fp32 vectors, rounding stores back (to nearest, truncating to a code, or
// stochastically to bf16), widening to double, sqrt and sign. xsimd does the arithmetic; the 16-
// and 8-bit conversions and the 32-bit integer hash, which xsimd 8.1 provides only as scalar
// loops (or not at all), are intrinsics here. Every primitive is exact or correctly rounded, so a
// vector lane computes the same bits as ScalarOps on one element.
// Each specialisation exists only in the translation unit compiled with its instruction set.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <xsimd/xsimd.hpp>

#include "cpu_adam/rounding_hash.hpp"
#include "cpu_adam/typed_span.hpp"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace strata::cpu_adam::detail {
namespace {  // internal linkage: each kernel TU gets its own copies, compiled with its own flags

// One element at a time. Also the tail of every vector loop, so tails match the lanes.
struct ScalarOps {
  using F = float;
  static constexpr std::size_t kWidth = 1;

  static F load(const float* p) { return *p; }
  static F load(const Bf16* p) { return to_float(*p); }
  static F load(const Fp16* p) { return to_float(*p); }
  static void store(float* p, F x) { *p = x; }
  static void store(Bf16* p, F x) { *p = to_bf16(x); }
  static void store(Fp16* p, F x) { *p = to_fp16(x); }
  // Stochastic rounding of element `low` (its low 32 bits) under `high_key`.
  static void store_stochastic(Bf16* p, F x, std::uint32_t high_key, std::uint32_t low) {
    *p = round_stochastic(x, stochastic_noise(high_key, low));
  }
  // The builtin, not std::sqrt: at -O0 std::sqrt(float) is a weak out-of-line function that a
  // wider level's file would also emit (compiled with its flags).
  static F sqrt(F x) { return __builtin_sqrtf(x); }
  static F sign(F x) { return static_cast<float>(x > 0.0f) - static_cast<float>(x < 0.0f); }
  // The 8-bit state codes (state_codec.hpp): exact int <-> float conversions, truncation.
  static F load(const std::int8_t* p) { return static_cast<float>(*p); }
  static F load(const std::uint8_t* p) { return static_cast<float>(*p); }
  static void store_truncated(std::int8_t* p, F x) {
    *p = static_cast<std::int8_t>(static_cast<int>(x));
  }
  static void store_truncated(std::uint8_t* p, F x) {
    *p = static_cast<std::uint8_t>(static_cast<int>(x));
  }
  static F abs(F x) { return __builtin_fabsf(x); }
  // x with its low 16 bits cleared: x cut to bf16 toward zero, still as fp32.
  static F truncate_bf16(F x) {
    return strata::detail::bits_float(strata::detail::float_bits(x) & 0xFFFF'0000u);
  }
  static F nan_to_zero(F x) { return x == x ? x : 0.0f; }
  // a + b, or a itself when b is zero (so -0 + 0 stays -0).
  static F add_nonzero(F a, F b) { return b == 0.0f ? a : a + b; }
  static F copysign(F magnitude, F sign) { return __builtin_copysignf(magnitude, sign); }
  static F min(F a, F b) { return b < a ? b : a; }
  static F max(F a, F b) { return a < b ? b : a; }
  static float reduce_max(F x) { return x; }
};

template <class Arch>
struct VectorOps;

// Things every vector level shares; each level adds its 16-bit conversions.
template <class Arch>
struct VectorOpsBase {
  using F = xsimd::batch<float, Arch>;
  using D = xsimd::batch<double, Arch>;
  static constexpr std::size_t kWidth = F::size;
  static constexpr std::size_t kDoubles = D::size;
  static_assert(kDoubles * 2 == kWidth);

  static F load(const float* p) { return F::load_unaligned(p); }
  static void store(float* p, F x) { x.store_unaligned(p); }
  static F sqrt(F x) { return xsimd::sqrt(x); }
  static F sign(F x) {
    const F zero(0.0f);
    const F one(1.0f);
    return xsimd::select(x > zero, one, zero) - xsimd::select(x < zero, one, zero);
  }
  static F abs(F x) { return xsimd::abs(x); }
  static F truncate_bf16(F x) {
    // The mask as a float (a NaN pattern; broadcasting keeps its bits).
    return xsimd::bitwise_and(x, F(strata::detail::bits_float(0xFFFF'0000u)));
  }
  static F nan_to_zero(F x) { return xsimd::select(x == x, x, F(0.0f)); }
  static F add_nonzero(F a, F b) { return xsimd::select(b == F(0.0f), a, a + b); }
  static F copysign(F magnitude, F sign) { return xsimd::copysign(magnitude, sign); }
  // Written as selects so NaN-free inputs give the scalar ternary's result in every lane.
  static F min(F a, F b) { return xsimd::select(b < a, b, a); }
  static F max(F a, F b) { return xsimd::select(a < b, b, a); }
  static float reduce_max(F x) {
    alignas(64) float lanes[kWidth];
    x.store_aligned(lanes);
    float best = lanes[0];
    for (std::size_t k = 1; k < kWidth; ++k) best = lanes[k] > best ? lanes[k] : best;
    return best;
  }
  // The norm's double accumulators (see norm_kernel).
  static D zero_d() { return D(0.0); }
  static D square_add(D x, D sum) { return xsimd::fma(x, x, sum); }
  static void store_d(double* p, D x) { x.store_unaligned(p); }
  // Hides a value from the optimiser so a load/store pair with no arithmetic is kept.
  static void opaque(F& x) {
    typename F::register_type reg = x;
    asm volatile("" : "+v"(reg));
    x = F(reg);
  }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
template <>
struct VectorOps<xsimd::avx512bw> : VectorOpsBase<xsimd::avx512bw> {
  using VectorOpsBase::load;
  using VectorOpsBase::store;

  static F load(const Bf16* p) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
  }
  static F load(const Fp16* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // fp32 bits whose top half is the bf16 nearest to x (ties to even, NaNs quieted).
  static __m512i nearest_bits(F x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    const __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x0040'0000));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(is_nan, rounded, quiet);
  }
  static void store(Bf16* p, F x) {
    const __m512i chosen = nearest_bits(x);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(chosen, 16)));
  }
  static void store(Fp16* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // 8-bit codes: sign/zero extension and truncating conversion; the narrowing is exact (codes are
  // in range by construction).
  static F load(const std::int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F load(const std::uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store_truncated(std::int8_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x)));
  }
  static void store_truncated(std::uint8_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x)));
  }
  static void store_stochastic(Bf16* p, F x, std::uint32_t high_key, std::uint32_t low) {
    const __m512i lanes = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(low)),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i h = _mm512_add_epi32(
        _mm512_mullo_epi32(lanes, _mm512_set1_epi32(static_cast<int>(kNoiseSpread))),
        _mm512_set1_epi32(static_cast<int>(high_key)));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(kNoiseMix1)));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(kNoiseMix2)));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i stochastic =
        _mm512_add_epi32(bits, _mm512_and_si512(h, _mm512_set1_epi32(0xFFFF)));
    const __m512i exponent = _mm512_set1_epi32(0x7F80'0000);
    const __mmask16 special =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent);
    const __m512i chosen = _mm512_mask_blend_epi32(special, stochastic, nearest_bits(x));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(chosen, 16)));
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
template <>
struct VectorOps<xsimd::fma3<xsimd::avx2>> : VectorOpsBase<xsimd::fma3<xsimd::avx2>> {
  using VectorOpsBase::load;
  using VectorOpsBase::store;

  static F load(const Bf16* p) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
  }
  static F load(const Fp16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // fp32 bits whose top half is the bf16 nearest to x (ties to even, NaNs quieted).
  static __m256i nearest_bits(F x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x0040'0000));
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), is_nan));
  }
  static void store_top_halves(Bf16* p, __m256i chosen) {
    const __m256i shifted = _mm256_srli_epi32(chosen, 16);
    // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; gather qwords 0 and 2.
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(shifted, shifted), _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static void store(Bf16* p, F x) { store_top_halves(p, nearest_bits(x)); }
  static void store(Fp16* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // 8-bit codes: sign/zero extension and truncating conversion; the saturating packs are exact
  // (codes are in range by construction).
  static F load(const std::int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F load(const std::uint8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static __m128i truncated_words(F x) {
    const __m256i integers = _mm256_cvttps_epi32(x);
    return _mm_packs_epi32(_mm256_castsi256_si128(integers),
                           _mm256_extracti128_si256(integers, 1));
  }
  static void store_truncated(std::int8_t* p, F x) {
    const __m128i words = truncated_words(x);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(words, words));
  }
  static void store_truncated(std::uint8_t* p, F x) {
    const __m128i words = truncated_words(x);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
  }
  static void store_stochastic(Bf16* p, F x, std::uint32_t high_key, std::uint32_t low) {
    const __m256i lanes = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(low)),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i h = _mm256_add_epi32(
        _mm256_mullo_epi32(lanes, _mm256_set1_epi32(static_cast<int>(kNoiseSpread))),
        _mm256_set1_epi32(static_cast<int>(high_key)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(kNoiseMix1)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(kNoiseMix2)));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i stochastic =
        _mm256_add_epi32(bits, _mm256_and_si256(h, _mm256_set1_epi32(0xFFFF)));
    const __m256i exponent = _mm256_set1_epi32(0x7F80'0000);
    const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent);
    store_top_halves(p, _mm256_blendv_epi8(stochastic, nearest_bits(x), special));
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// The norm at 256 bits with raw intrinsics, for the AVX2 and AVX-512 tables. 256-bit on AVX-512
// too: on Zen 4 (512-bit ops double-pumped) it runs twice as fast on cache-hot gradients (4.4 vs
// 8.9 ms per 100 M fp32), with the same bits. Raw intrinsics rather than xsimd's AVX2 batch so the
// AVX-512 file instantiates no xsimd type of another level (debug builds would otherwise emit weak
// AVX-512-encoded copies that the linker could hand to the AVX2 table).
struct Norm256Ops {
  using D = __m256d;
  static constexpr std::size_t kWidth = 8;  // elements per widen()
  static constexpr std::size_t kDoubles = 4;

  static D zero_d() { return _mm256_setzero_pd(); }
  static D square_add(D x, D sum) { return _mm256_fmadd_pd(x, x, sum); }
  static void store_d(double* p, D x) { _mm256_storeu_pd(p, x); }
  static void widen(const float* p, D& low, D& high) {
    low = _mm256_cvtps_pd(_mm_loadu_ps(p));
    high = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
  }
  // Interleaving zeros below each bf16 gives its fp32 bits: no shift, no lane extract.
  static void widen(const Bf16* p, D& low, D& high) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i zero = _mm_setzero_si128();
    low = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(zero, halves)));
    high = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi16(zero, halves)));
  }
  static void widen(const Fp16* p, D& low, D& high) {
    low = _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    high = _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 4))));
  }
};
#endif

#if defined(__SSE2__)
template <>
struct VectorOps<xsimd::sse2> : VectorOpsBase<xsimd::sse2> {
  using VectorOpsBase::load;
  using VectorOpsBase::store;

  static F load(const Bf16* p) {
    // Interleaving zeros below each 16-bit value is exactly the 16-bit left shift.
    const __m128i halves = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), halves));
  }
  static F load(const Fp16* p) {  // SSE2 has no F16C: exact scalar conversions
    return _mm_setr_ps(to_float(p[0]), to_float(p[1]), to_float(p[2]), to_float(p[3]));
  }
  static __m128i select(__m128i mask, __m128i if_set, __m128i if_clear) {
    return _mm_or_si128(_mm_and_si128(mask, if_set), _mm_andnot_si128(mask, if_clear));
  }
  // fp32 bits whose top half is the bf16 nearest to x (ties to even, NaNs quieted).
  static __m128i nearest_bits(F x) {
    const __m128i bits = _mm_castps_si128(x);
    const __m128i lsb = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(1));
    const __m128i rounded = _mm_add_epi32(bits, _mm_add_epi32(_mm_set1_epi32(0x7FFF), lsb));
    const __m128i quiet = _mm_or_si128(bits, _mm_set1_epi32(0x0040'0000));
    return select(_mm_castps_si128(_mm_cmpunord_ps(x, x)), quiet, rounded);
  }
  static void store_top_halves(Bf16* p, __m128i chosen) {
    // An arithmetic shift keeps each top half in int16 range, so the signed pack is exact.
    const __m128i shifted = _mm_srai_epi32(chosen, 16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi32(shifted, shifted));
  }
  static void store(Bf16* p, F x) { store_top_halves(p, nearest_bits(x)); }
  // 8-bit codes: widening by unpacking (sign-extended by an arithmetic shift), truncating
  // conversion narrowed by packs that are exact (codes are in range by construction).
  static F load(const std::int8_t* p) {
    std::int32_t word;
    std::memcpy(&word, p, sizeof(word));
    __m128i x = _mm_cvtsi32_si128(word);
    x = _mm_unpacklo_epi8(x, x);
    x = _mm_unpacklo_epi16(x, x);
    return _mm_cvtepi32_ps(_mm_srai_epi32(x, 24));
  }
  static F load(const std::uint8_t* p) {
    std::int32_t word;
    std::memcpy(&word, p, sizeof(word));
    const __m128i zero = _mm_setzero_si128();
    const __m128i x = _mm_unpacklo_epi8(_mm_cvtsi32_si128(word), zero);
    return _mm_cvtepi32_ps(_mm_unpacklo_epi16(x, zero));
  }
  static void store_truncated(std::int8_t* p, F x) {
    const __m128i words = _mm_packs_epi32(_mm_cvttps_epi32(x), _mm_setzero_si128());
    const std::int32_t word = _mm_cvtsi128_si32(_mm_packs_epi16(words, words));
    std::memcpy(p, &word, sizeof(word));
  }
  static void store_truncated(std::uint8_t* p, F x) {
    const __m128i words = _mm_packs_epi32(_mm_cvttps_epi32(x), _mm_setzero_si128());
    const std::int32_t word = _mm_cvtsi128_si32(_mm_packus_epi16(words, words));
    std::memcpy(p, &word, sizeof(word));
  }
  // Low 32 bits of each lane's product with a constant (SSE2 has no 32-bit mullo).
  static __m128i multiply_low(__m128i x, std::uint32_t constant) {
    const __m128i c = _mm_set1_epi32(static_cast<int>(constant));
    const __m128i even = _mm_mul_epu32(x, c);
    const __m128i odd = _mm_mul_epu32(_mm_srli_epi64(x, 32), c);
    return _mm_unpacklo_epi32(_mm_shuffle_epi32(even, _MM_SHUFFLE(0, 0, 2, 0)),
                              _mm_shuffle_epi32(odd, _MM_SHUFFLE(0, 0, 2, 0)));
  }
  static void store_stochastic(Bf16* p, F x, std::uint32_t high_key, std::uint32_t low) {
    const __m128i lanes =
        _mm_add_epi32(_mm_set1_epi32(static_cast<int>(low)), _mm_setr_epi32(0, 1, 2, 3));
    __m128i h = _mm_add_epi32(multiply_low(lanes, kNoiseSpread),
                              _mm_set1_epi32(static_cast<int>(high_key)));
    h = _mm_xor_si128(h, _mm_srli_epi32(h, 16));
    h = multiply_low(h, kNoiseMix1);
    h = _mm_xor_si128(h, _mm_srli_epi32(h, 15));
    h = multiply_low(h, kNoiseMix2);
    h = _mm_xor_si128(h, _mm_srli_epi32(h, 16));
    const __m128i bits = _mm_castps_si128(x);
    const __m128i stochastic = _mm_add_epi32(bits, _mm_and_si128(h, _mm_set1_epi32(0xFFFF)));
    const __m128i exponent = _mm_set1_epi32(0x7F80'0000);
    const __m128i special = _mm_cmpeq_epi32(_mm_and_si128(bits, exponent), exponent);
    store_top_halves(p, select(special, nearest_bits(x), stochastic));
  }
  static void store(Fp16* p, F x) {
    alignas(16) float values[4];
    _mm_store_ps(values, x);
    for (int k = 0; k < 4; ++k) p[k] = to_fp16(values[k]);
  }
  static void widen(F x, D& low, D& high) {
    low = _mm_cvtps_pd(x);
    high = _mm_cvtps_pd(_mm_movehl_ps(x, x));
  }
  template <class T>
  static void widen(const T* p, D& low, D& high) {
    widen(load(p), low, high);
  }
};
#endif

}  // namespace
}  // namespace strata::cpu_adam::detail
