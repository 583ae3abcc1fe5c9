// Proves the reference AdamW: the first step moves every parameter by lr against its gradient's
// sign, clipping scales gradients to the global norm, and decay spares biases and gains.
#include "models/gpt/reference_adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "models/gpt/parameter_store.hpp"

namespace strata::gpt {
namespace {

runtime::ModelConfig tiny_config() {
  runtime::ModelConfig config;
  config.layers = 1;
  config.d_model = 8;
  config.heads = 2;
  config.seq_len = 4;
  config.vocab = 16;
  config.micro_batch = 1;
  return config;
}

TEST(ReferenceAdamW, FirstStepMovesByLearningRateAgainstTheGradient) {
  ParameterStore params(gpt_units(tiny_config()));
  params.fill(0.5f);
  ParameterStore grads(params.units());
  for (std::size_t u = 0; u < grads.units().size(); ++u) {
    for (std::size_t i = 0; i < grads.unit(u).size(); ++i) {
      grads.unit(u)[i] = (i % 2 == 0 ? 1.0f : -1.0f) * 1e-3f * static_cast<float>(1 + i % 7);
    }
  }
  ReferenceAdamW optimizer(params, AdamWOptions{.lr = 0.01, .weight_decay = 0.0, .grad_clip = 0});
  optimizer.step(params, grads);
  for (std::size_t u = 0; u < params.units().size(); ++u) {
    for (std::size_t i = 0; i < params.unit(u).size(); ++i) {
      // m̂ / √v̂ = g / |g| on the first step (eps aside).
      const float expected = 0.5f - (i % 2 == 0 ? 0.01f : -0.01f);
      ASSERT_NEAR(params.unit(u)[i], expected, 1e-6) << params.units()[u].name << " " << i;
    }
  }
}

TEST(ReferenceAdamW, ClipsToTheGlobalNormAndDecaysOnlyMatrices) {
  ParameterStore params(gpt_units(tiny_config()));
  params.fill(1.0f);
  ParameterStore grads(params.units());
  grads.fill(0.0f);
  grads.find("h.0.mlp.c_fc.bias")[0] = 3.0f;
  grads.find("wte.weight")[0] = 4.0f;
  ReferenceAdamW optimizer(params, AdamWOptions{.lr = 0.1, .weight_decay = 0.5, .grad_clip = 1.0});
  EXPECT_DOUBLE_EQ(optimizer.step(params, grads), 5.0);
  EXPECT_FLOAT_EQ(grads.find("h.0.mlp.c_fc.bias")[0], 0.6f);  // 3 · 1/5
  EXPECT_FLOAT_EQ(grads.find("wte.weight")[0], 0.8f);
  // Zero gradient: only decay moves a parameter, and only a matrix or embedding.
  EXPECT_FLOAT_EQ(params.find("wte.weight")[1], 1.0f * (1.0f - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(params.find("h.0.attn.c_attn.weight")[5], 0.95f);
  EXPECT_FLOAT_EQ(params.find("h.0.mlp.c_fc.bias")[1], 1.0f);
  EXPECT_FLOAT_EQ(params.find("h.0.ln_1.weight")[0], 1.0f);
}

}  // namespace
}  // namespace strata::gpt
