// Run-time detection of the SIMD level: xsimd's CPUID probe for the instruction-set families, plus
// CPUID for F16C and the compiler's probe for AVX-512 VL (the two xsimd 8.1 does not report).
#include "cpu_adam/simd_level.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <array>

#include <xsimd/xsimd.hpp>

#include "base/assert.hpp"
#include "cpu_adam/detail/kernel_table.hpp"

namespace strata::cpu_adam {
namespace {

constexpr std::array kAllLevels = {SimdLevel::kScalar, SimdLevel::kSse2, SimdLevel::kAvx2,
                                   SimdLevel::kAvx512};

#if defined(__x86_64__) || defined(__i386__)
// CPUID leaf 1, ECX bit 29. clang 14 (the fuzz preset's compiler) does not take "f16c" in
// __builtin_cpu_supports, so it is read here for both compilers.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
#endif

bool cpu_supports(SimdLevel level) {
#if defined(__x86_64__) || defined(__i386__)
  const auto archs = xsimd::available_architectures();
  switch (level) {
    case SimdLevel::kScalar:
      return true;
    case SimdLevel::kSse2:
      return archs.sse2 != 0;
    case SimdLevel::kAvx2:
      return archs.fma3_avx2 != 0 && cpu_has_f16c();
    case SimdLevel::kAvx512:
      return archs.avx512bw != 0 && archs.avx512dq != 0 && __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return level == SimdLevel::kScalar;
#endif
}

}  // namespace

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kSse2:
      return "sse2";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

std::optional<SimdLevel> parse_simd_level(std::string_view text) {
  for (SimdLevel level : kAllLevels) {
    if (text == simd_level_name(level)) return level;
  }
  return std::nullopt;
}

int simd_width(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return 1;
    case SimdLevel::kSse2:
      return 4;
    case SimdLevel::kAvx2:
      return 8;
    case SimdLevel::kAvx512:
      return 16;
  }
  return 1;
}

bool simd_level_available(SimdLevel level) {
  static const std::array<bool, kAllLevels.size()> available = [] {
    std::array<bool, kAllLevels.size()> result{};
    for (std::size_t k = 0; k < kAllLevels.size(); ++k) result[k] = cpu_supports(kAllLevels[k]);
    return result;
  }();
  return available[static_cast<std::size_t>(level)];
}

std::vector<SimdLevel> available_simd_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : kAllLevels) {
    if (simd_level_available(level)) levels.push_back(level);
  }
  return levels;
}

SimdLevel best_simd_level() {
  static const SimdLevel best = available_simd_levels().back();
  return best;
}

namespace detail {

const KernelTable& kernels_for(SimdLevel level) {
  STRATA_ASSERT(simd_level_available(level), "SIMD level not available on this CPU");
  switch (level) {
#if defined(__x86_64__) || defined(__i386__)
    case SimdLevel::kSse2:
      return sse2_kernels();
    case SimdLevel::kAvx2:
      return avx2_kernels();
    case SimdLevel::kAvx512:
      return avx512_kernels();
#endif
    default:
      return scalar_kernels();
  }
}

}  // namespace detail
}  // namespace strata::cpu_adam
