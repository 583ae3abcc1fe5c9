// The weighted next-token cross-entropy over rows of logits [rows × vocab]:
//   loss_sum = Σ_r w_r·(-log softmax(logits_r)[target_r]),  weight = Σ_r w_r,
//   mean = loss_sum / weight, dlogits_r = w_r / weight·(softmax_r - onehot(target_r)).
// A row of weight 0 costs nothing and gets a zero gradient; a batch of total weight 0 has mean 0
// and zero gradients. Rows run in parallel; the sums add rows in order (deterministic).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::llm::detail {

struct LossTotals {
  double loss_sum = 0.0;
  double weight = 0.0;
  double mean() const { return weight > 0.0 ? loss_sum / weight : 0.0; }
};

// row_loss: rows doubles of scratch.
LossTotals weighted_cross_entropy(const float* logits, const std::int32_t* targets,
                                  const float* weights, float* dlogits, double* row_loss,
                                  std::size_t rows, std::size_t vocab);

}  // namespace strata::llm::detail
