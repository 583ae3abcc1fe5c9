#include "runtime/tune/validation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/assert.hpp"

namespace strata::runtime::tune {

std::vector<std::size_t> round_order(std::size_t n, std::uint32_t round) {
  if (n == 0) return {};
  // Strides coprime to n, alternating ends: 1, n - 1, 2, n - 2, ... (n = 1, 2: only 1).
  std::vector<std::size_t> strides;
  for (std::size_t low = 1, high = n - 1; low <= high; ++low, --high) {
    if (std::gcd(low, n) == 1) strides.push_back(low);
    if (high != low && std::gcd(high, n) == 1) strides.push_back(high);
  }
  if (strides.empty()) strides.push_back(1);  // n = 1
  const std::size_t stride = strides[round % strides.size()];
  std::size_t start = round % n;
  // A round that would start with the config the previous one ended with starts one further on.
  if (round > 0 && n > 1 && round_order(n, round - 1).back() == start) start = (start + 1) % n;
  std::vector<std::size_t> order(n);
  for (std::size_t k = 0; k < n; ++k) order[k] = (start + k * stride) % n;
  return order;
}

RoundFigures summarize(std::span<const double> samples_s) {
  STRATA_ASSERT(!samples_s.empty());
  std::vector<double> sorted(samples_s.begin(), samples_s.end());
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  const double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  return {median, sorted.front(), sorted.back()};
}

bool within_prediction(double measured_s, double predicted_s) {
  return predicted_s > 0 && std::abs(measured_s / predicted_s - 1) <= kPredictionTolerance;
}

HandComparison compare_to_hand(const RoundFigures& tuned, const RoundFigures& hand) {
  HandComparison out;
  out.difference_s = tuned.median_s - hand.median_s;
  out.noise_s = std::max(tuned.spread_s(), hand.spread_s());
  out.verdict = out.difference_s <= 0           ? Comparison::kNoWorse
                : out.difference_s < out.noise_s ? Comparison::kWithinNoise
                                                 : Comparison::kWorse;
  return out;
}

}  // namespace strata::runtime::tune
