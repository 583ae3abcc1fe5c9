// Proves the GPT's backward: every tensor's analytic gradient matches central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "models/gpt/gpt_model.hpp"
#include "models/gpt/parameter_store.hpp"
#include "tests/models/tiny_gpt_config.hpp"

namespace strata::gpt {
namespace {

using testing::tiny_config;

// Parameters far from the GPT-2 initialisation (LayerNorm gains around 1, everything else of
// order 0.3) so that every tensor, biases included, carries gradients well above the
// finite-difference noise floor.
ParameterStore random_parameters(const std::vector<UnitSpec>& units, std::uint64_t seed) {
  ParameterStore store(units);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::vector<std::span<float>> tensors = store.mutable_views(u);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const float base = units[u].tensors[t].init == InitKind::kOnes ? 1.0f : 0.0f;
      for (float& value : tensors[t]) {
        value = base + uniform(rng);
      }
    }
  }
  return store;
}

std::vector<std::int32_t> random_tokens(std::size_t count, std::uint32_t vocab,
                                        std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> tokens(count);
  for (std::int32_t& token : tokens) {
    token = static_cast<std::int32_t>(rng() % vocab);
  }
  return tokens;
}

class GptGradientTest : public ::testing::TestWithParam<bool> {};

TEST_P(GptGradientTest, MatchesCentralDifferencesOnEveryTensor) {
  constexpr std::uint64_t kSeed = 20261129;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  set_blas_threads(1);
  const runtime::ModelConfig config = tiny_config(GetParam());
  GptModel model(config);
  ParameterStore params = random_parameters(model.units(), kSeed);
  ParameterStore grads(model.units());
  const std::vector<std::int32_t> tokens =
      random_tokens(model.batch_tokens(), config.vocab, kSeed + 1);
  forward_backward(model, params, grads, tokens);

  // fp32 forward: the loss (~3.5) carries rounding noise of a few 1e-7, which a step of
  // h = 5e-3 turns into a few 1e-5 in (L(p+h) - L(p-h)) / 2h; the truncation error h^2/6 L'''
  // is of the same order for these O(1) activations (at h = 2e-2 it dominates: wpe reaches
  // 5e-4). Measured with this seed: worst |fd - analytic| = 4e-5, 0.18 of the bound
  // |fd - analytic| <= 2e-4 + 2e-2 |analytic|.
  constexpr float kStep = 5e-3f;
  constexpr double kAbsoluteTolerance = 2e-4;
  constexpr double kRelativeTolerance = 2e-2;
  constexpr std::size_t kSamplesPerTensor = 6;
  std::mt19937_64 rng(kSeed + 2);
  std::size_t checked = 0;
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    const std::vector<std::span<float>> tensors = params.mutable_views(u);
    const std::vector<std::span<float>> tensor_grads = grads.mutable_views(u);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::string& name = model.units()[u].tensors[t].name;
      double largest_gradient = 0.0;
      for (std::size_t sample = 0; sample < kSamplesPerTensor; ++sample) {
        const std::size_t i = rng() % tensors[t].size();
        const float saved = tensors[t][i];
        tensors[t][i] = saved + kStep;
        const double loss_plus = forward_loss(model, params, tokens);
        tensors[t][i] = saved - kStep;
        const double loss_minus = forward_loss(model, params, tokens);
        tensors[t][i] = saved;
        const double numeric = (loss_plus - loss_minus) / (2.0 * kStep);
        const double analytic = tensor_grads[t][i];
        EXPECT_NEAR(analytic, numeric, kAbsoluteTolerance + kRelativeTolerance * std::abs(analytic))
            << name << "[" << i << "]";
        largest_gradient = std::max(largest_gradient, std::abs(analytic));
        ++checked;
      }
      // A tensor whose sampled gradients are all ~0 would pass vacuously.
      EXPECT_GT(largest_gradient, 10 * kAbsoluteTolerance) << name << " has no gradient to check";
    }
  }
  EXPECT_EQ(checked, kSamplesPerTensor * (2 + 2 * kBlockTensorCount + (GetParam() ? 2 : 3)));
}

INSTANTIATE_TEST_SUITE_P(Head, GptGradientTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& param_info) {
                           return param_info.param ? "Tied" : "Untied";
                         });

}  // namespace
}  // namespace strata::gpt
