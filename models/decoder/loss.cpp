#include "models/decoder/loss.hpp"

#include <algorithm>
#include <cmath>

#include "models/decoder/parallel_rows.hpp"

namespace strata::llm::detail {

LossTotals weighted_cross_entropy(const float* logits, const std::int32_t* targets,
                                  const float* weights, float* dlogits, double* row_loss,
                                  std::size_t rows, std::size_t vocab) {
  LossTotals totals;
  for (std::size_t r = 0; r < rows; ++r) totals.weight += weights[r];
  const float inv_weight = totals.weight > 0.0 ? static_cast<float>(1.0 / totals.weight) : 0.0f;
  parallel_rows(rows, 1, [&](std::size_t r) {
    const float* row = logits + r * vocab;
    float* drow = dlogits + r * vocab;
    if (weights[r] == 0.0f) {
      std::fill(drow, drow + vocab, 0.0f);
      row_loss[r] = 0.0;
      return;
    }
    const float row_max = *std::max_element(row, row + vocab);
    float sum = 0.0f;
    for (std::size_t i = 0; i < vocab; ++i) {
      drow[i] = std::exp(row[i] - row_max);
      sum += drow[i];
    }
    const float scale = weights[r] * inv_weight;
    const float softmax_scale = scale / sum;
    for (std::size_t i = 0; i < vocab; ++i) drow[i] *= softmax_scale;
    const auto target = static_cast<std::size_t>(targets[r]);
    drow[target] -= scale;
    // -log softmax[target] = log Σ exp(l - max) - (l_target - max).
    row_loss[r] = static_cast<double>(std::log(sum)) - static_cast<double>(row[target] - row_max);
  });
  for (std::size_t r = 0; r < rows; ++r) totals.loss_sum += weights[r] * row_loss[r];
  return totals;
}

}  // namespace strata::llm::detail
