// Which SIMD instruction set the cpu_adam kernels run with. One binary carries every level; the
// best one the running CPU supports is picked at run time (no -march=native needed), and tests or
// benchmarks can force a lower one. Every level produces bitwise identical results.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace strata::cpu_adam {

enum class SimdLevel {
  kScalar,  // portable C++ loops (any CPU; also the fallback on Arm for now)
  kSse2,    // x86-64 baseline, 4 floats per vector
  kAvx2,    // AVX2 + FMA + F16C, 8 floats per vector
  kAvx512,  // AVX-512 F/BW/DQ/VL, 16 floats per vector
};

std::string_view simd_level_name(SimdLevel level);
std::optional<SimdLevel> parse_simd_level(std::string_view text);

// Floats per vector register at `level` (1 for scalar).
int simd_width(SimdLevel level);

// True when this binary has kernels for `level` and the running CPU can execute them.
bool simd_level_available(SimdLevel level);

// Every available level, lowest first; the last one is what best_simd_level() returns.
std::vector<SimdLevel> available_simd_levels();

// The best available level, detected once per process.
SimdLevel best_simd_level();

}  // namespace strata::cpu_adam
