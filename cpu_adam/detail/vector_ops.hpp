// Per-instruction-set vector primitives for the kernels: loads of fp32/bf16/fp16 into fp32
// vectors, rounding stores back, widening to double, sqrt and sign. xsimd does the arithmetic;
// the 16-bit conversions, which xsimd 8.1 does not provide, are intrinsics here. Every primitive is
// exact or correctly rounded, so a vector lane computes the same bits as ScalarOps on one element.
// Each specialisation exists only in the translation unit compiled with its instruction set.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <xsimd/xsimd.hpp>

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
  // The 8-bit state codes: xsimd's converting loads and stores (element-wise exact conversions).
  static F load(const std::int8_t* p) { return F::load_unaligned(p); }
  static F load(const std::uint8_t* p) { return F::load_unaligned(p); }
  static void store_truncated(std::int8_t* p, F x) {
    xsimd::batch_cast<std::int32_t>(x).store_unaligned(p);
  }
  static void store_truncated(std::uint8_t* p, F x) {
    xsimd::batch_cast<std::int32_t>(x).store_unaligned(p);
  }
  static F abs(F x) { return xsimd::abs(x); }
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
  static void store(Bf16* p, F x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    const __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x0040'0000));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i chosen = _mm512_mask_blend_epi32(is_nan, rounded, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(chosen, 16)));
  }
  static void store(Fp16* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
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
  static void store(Bf16* p, F x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x0040'0000));
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256i chosen = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), is_nan));
    const __m256i shifted = _mm256_srli_epi32(chosen, 16);
    // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; gather qwords 0 and 2.
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(shifted, shifted), _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static void store(Fp16* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
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
  static void store(Bf16* p, F x) {
    const __m128i bits = _mm_castps_si128(x);
    const __m128i lsb = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(1));
    const __m128i rounded = _mm_add_epi32(bits, _mm_add_epi32(_mm_set1_epi32(0x7FFF), lsb));
    const __m128i quiet = _mm_or_si128(bits, _mm_set1_epi32(0x0040'0000));
    const __m128i is_nan = _mm_castps_si128(_mm_cmpunord_ps(x, x));
    const __m128i chosen =
        _mm_or_si128(_mm_and_si128(is_nan, quiet), _mm_andnot_si128(is_nan, rounded));
    // An arithmetic shift keeps each top half in int16 range, so the signed pack is exact.
    const __m128i shifted = _mm_srai_epi32(chosen, 16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi32(shifted, shifted));
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
