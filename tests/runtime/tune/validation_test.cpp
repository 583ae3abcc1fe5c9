// Proves the arithmetic of `strata tune --validate`: every round times every config once, in an
// order whose neighbours change from round to round; medians and spreads over the rounds; the 15%
// verdict; and a tuned config slower than a hand config by less than the noise called so.
#include <algorithm>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/tune/validation.hpp"

namespace strata::runtime::tune {
namespace {

TEST(ValidationOrder, EachRoundIsAPermutationAndNoConfigRunsTwiceInARow) {
  for (std::size_t n = 1; n <= 9; ++n) {
    std::size_t previous_last = n;  // none yet
    for (std::uint32_t round = 0; round < 6; ++round) {
      std::vector<std::size_t> order = round_order(n, round);
      ASSERT_EQ(order.size(), n) << "n " << n << " round " << round;
      if (n > 1) {
        EXPECT_NE(order.front(), previous_last) << "n " << n << " round " << round;
      }
      previous_last = order.back();
      std::sort(order.begin(), order.end());
      for (std::size_t k = 0; k < n; ++k) EXPECT_EQ(order[k], k) << "n " << n << " round " << round;
    }
  }
  EXPECT_TRUE(round_order(0, 0).empty());
}

// Over three rounds run back to back, no config (of three or more) is always timed right after
// the same one: a rotated order alone would keep every neighbour.
TEST(ValidationOrder, NoConfigAlwaysFollowsTheSameOne) {
  for (std::size_t n = 3; n <= 9; ++n) {
    std::vector<std::size_t> sequence;
    for (std::uint32_t round = 0; round < 3; ++round) {
      const std::vector<std::size_t> order = round_order(n, round);
      sequence.insert(sequence.end(), order.begin(), order.end());
    }
    std::vector<std::set<std::size_t>> predecessors(n);
    for (std::size_t k = 1; k < sequence.size(); ++k) {
      predecessors[sequence[k]].insert(sequence[k - 1]);
    }
    for (std::size_t config = 0; config < n; ++config) {
      EXPECT_GE(predecessors[config].size(), 2u) << "n " << n << " config " << config;
    }
  }
}

TEST(ValidationFigures, MedianAndSpreadOverTheRounds) {
  const std::vector<double> odd = {0.30, 0.10, 0.20};
  const RoundFigures f = summarize(odd);
  EXPECT_DOUBLE_EQ(f.median_s, 0.20);
  EXPECT_DOUBLE_EQ(f.min_s, 0.10);
  EXPECT_DOUBLE_EQ(f.max_s, 0.30);
  EXPECT_DOUBLE_EQ(f.spread_s(), 0.20);
  const std::vector<double> even = {0.4, 0.1, 0.2, 0.3};
  EXPECT_DOUBLE_EQ(summarize(even).median_s, 0.25);
  const std::vector<double> one = {0.5};
  EXPECT_DOUBLE_EQ(summarize(one).spread_s(), 0);
}

TEST(ValidationVerdicts, WithinFifteenPercentOfThePrediction) {
  EXPECT_TRUE(within_prediction(1.14, 1.0));
  EXPECT_TRUE(within_prediction(0.86, 1.0));
  EXPECT_FALSE(within_prediction(1.16, 1.0));
  EXPECT_FALSE(within_prediction(0.84, 1.0));
  EXPECT_FALSE(within_prediction(1.0, 0.0));
}

TEST(ValidationVerdicts, ASlowerTunedConfigWithinTheLargerSpreadIsNoise) {
  const RoundFigures tuned{0.520, 0.500, 0.560};  // spread 0.060
  const RoundFigures faster{0.500, 0.495, 0.505};  // spread 0.010
  const HandComparison noise = compare_to_hand(tuned, faster);
  EXPECT_EQ(noise.verdict, Comparison::kWithinNoise);
  EXPECT_NEAR(noise.difference_s, 0.020, 1e-12);
  EXPECT_NEAR(noise.noise_s, 0.060, 1e-12);

  const RoundFigures much_faster{0.400, 0.395, 0.405};
  EXPECT_EQ(compare_to_hand(tuned, much_faster).verdict, Comparison::kWorse);
  const RoundFigures slower{0.600, 0.590, 0.610};
  const HandComparison better = compare_to_hand(tuned, slower);
  EXPECT_EQ(better.verdict, Comparison::kNoWorse);
  EXPECT_LT(better.difference_s, 0);
  // Without spread (one round) any slower figure is worse.
  EXPECT_EQ(compare_to_hand({0.51, 0.51, 0.51}, {0.50, 0.50, 0.50}).verdict, Comparison::kWorse);
}

}  // namespace
}  // namespace strata::runtime::tune
