// The arithmetic of `strata tune --validate` (runtime/cli/tune_validate.cpp): the order each round
// times the configs in, each config's median and spread over the rounds, and the two verdicts of
// issue #17 (the tuned config within 15% of its prediction; no worse than the best hand config,
// where a difference smaller than the noise is reported as such). Pure: the CLI does the timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace strata::runtime::tune {

// The configs 0..n-1 in the order round `round` times them: from config round % n (one further
// on when the previous round ended with it: no config runs twice in a row), in steps of a stride
// coprime to n that changes each round (1, n - 1, 2, n - 2, ...: forward, backward, ...), so with
// three configs or more no config runs right after the same one in every round (a rotation alone
// would keep every neighbour). A permutation of 0..n-1; empty for n = 0.
std::vector<std::size_t> round_order(std::size_t n, std::uint32_t round);

// One config's figures over the rounds: the median and the range (seconds).
struct RoundFigures {
  double median_s = 0;
  double min_s = 0;
  double max_s = 0;
  double spread_s() const { return max_s - min_s; }
};

// `samples_s` must not be empty.
RoundFigures summarize(std::span<const double> samples_s);

// The tuned config's measured median may differ from its prediction by this fraction.
inline constexpr double kPredictionTolerance = 0.15;

// |measured / predicted - 1| <= kPredictionTolerance.
bool within_prediction(double measured_s, double predicted_s);

enum class Comparison {
  kNoWorse,      // the tuned median is at most the other's
  kWithinNoise,  // slower by less than the larger of the two spreads
  kWorse,        // slower by that much or more
};

struct HandComparison {
  Comparison verdict = Comparison::kNoWorse;
  double difference_s = 0;  // tuned median - other median (negative: the tuned config is faster)
  double noise_s = 0;       // the larger of the two spreads
};

HandComparison compare_to_hand(const RoundFigures& tuned, const RoundFigures& hand);

}  // namespace strata::runtime::tune
