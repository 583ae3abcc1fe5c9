#include "models/decoder/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/assert.hpp"
#include "models/decoder/parallel_rows.hpp"

namespace strata::llm::detail {
namespace {

// Llama 3.1: long wavelengths slow down by `factor`, short ones stay, the band between blends.
void apply_llama3_scaling(const RopeScaling& scaling, std::vector<float>& inv_freq) {
  const double old_context = scaling.original_max_position_embeddings;
  const double low_freq_wavelen = old_context / scaling.low_freq_factor;
  const double high_freq_wavelen = old_context / scaling.high_freq_factor;
  for (float& frequency : inv_freq) {
    const double f = frequency;
    const double wavelen = 2.0 * std::numbers::pi / f;
    double scaled = wavelen > low_freq_wavelen ? f / scaling.factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const double smooth = (old_context / wavelen - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      scaled = (1.0 - smooth) * scaled / scaling.factor + smooth * scaled;
    }
    frequency = static_cast<float>(scaled);
  }
}

}  // namespace

std::vector<float> rope_inverse_frequencies(const HfConfig& config) {
  const std::size_t half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  for (std::size_t i = 0; i < half; ++i) {
    const double exponent =
        static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(config.head_dim));
    inv_freq[i] = static_cast<float>(1.0 / std::pow(config.rope_theta, exponent));
  }
  if (config.rope_scaling.type == RopeScaling::Type::kLlama3) {
    apply_llama3_scaling(config.rope_scaling, inv_freq);
  }
  return inv_freq;
}

RopeTable::RopeTable(const HfConfig& config, std::size_t positions)
    : half_(config.head_dim / 2), positions_(positions) {
  const std::vector<float> inv_freq = rope_inverse_frequencies(config);
  cos_.resize(positions * half_);
  sin_.resize(positions * half_);
  for (std::size_t p = 0; p < positions; ++p) {
    for (std::size_t i = 0; i < half_; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];  // fp32, as transformers
      cos_[p * half_ + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_[p * half_ + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

void RopeTable::rotate(float* x, std::size_t ld, std::size_t rows, std::size_t heads,
                       std::size_t rows_per_sequence, std::size_t first_position,
                       Direction direction, const std::uint32_t* row_positions) const {
  STRATA_ASSERT(rows_per_sequence > 0 &&
                    first_position + std::min(rows, rows_per_sequence) <= positions_,
                "positions beyond the rotary table");
  const float sign = direction == Direction::kForward ? 1.0f : -1.0f;
  const std::size_t head_dim = 2 * half_;
  parallel_rows(rows, 16, [&](std::size_t r) {
    const std::size_t position =
        row_positions != nullptr ? row_positions[r] : first_position + r % rows_per_sequence;
    const float* c = cos_.data() + position * half_;
    const float* s = sin_.data() + position * half_;
    for (std::size_t h = 0; h < heads; ++h) {
      float* x1 = x + r * ld + h * head_dim;
      float* x2 = x1 + half_;
      for (std::size_t i = 0; i < half_; ++i) {
        const float a = x1[i];
        const float b = x2[i];
        const float si = sign * s[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  });
}

}  // namespace strata::llm::detail
