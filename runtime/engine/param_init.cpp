#include "runtime/engine/param_init.hpp"

#include <cmath>
#include <numbers>

#include <xxhash.h>

namespace strata::runtime {
namespace {

// SplitMix64: a counter-based generator, so element i needs no state from elements before it.
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E37'79B9'7F4A'7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D0'49BB'1331'11EBull;
  return x ^ (x >> 31);
}

// A uniform double in (0, 1) from the top 53 bits.
double unit_interval(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

}  // namespace

void init_tensor_range(std::uint64_t seed, std::string_view unit_name, const TensorSpec& tensor,
                       std::uint64_t first_element, std::span<float> out) {
  switch (tensor.init.kind) {
    case InitKind::kZeros:
      for (float& value : out) value = 0.0f;
      return;
    case InitKind::kOnes:
      for (float& value : out) value = 1.0f;
      return;
    case InitKind::kNormal:
      break;
  }
  const std::uint64_t stream = XXH3_64bits_withSeed(unit_name.data(), unit_name.size(), seed) ^
                               XXH3_64bits(tensor.name.data(), tensor.name.size());
  for (std::size_t k = 0; k < out.size(); ++k) {
    // Box-Muller over two counter-derived uniforms; double precision, rounded once to fp32.
    const std::uint64_t i = first_element + k;
    const double u1 = unit_interval(splitmix64(stream ^ (2 * i)));
    const double u2 = unit_interval(splitmix64(stream ^ (2 * i + 1)));
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    out[k] = static_cast<float>(normal * tensor.init.std);
  }
}

}  // namespace strata::runtime
