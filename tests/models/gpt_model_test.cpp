// Proves the GPT's unit layout matches the config's parameter count and GPT-2's initialisation,
// that sliced initialisation equals the whole, and that steps are deterministic and overwrite
// their gradients.
#include "models/gpt/gpt_model.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "models/gpt/parameter_store.hpp"

namespace strata::gpt {
namespace {

runtime::ModelConfig small_config(bool tied_head) {
  runtime::ModelConfig config;
  config.layers = 3;
  config.d_model = 64;
  config.heads = 4;
  config.seq_len = 64;
  config.vocab = 256;
  config.micro_batch = 4;
  config.tied_head = tied_head;
  return config;
}

std::vector<std::int32_t> some_tokens(std::size_t count) {
  std::vector<std::int32_t> tokens(count);
  for (std::size_t i = 0; i < count; ++i) {
    tokens[i] = static_cast<std::int32_t>((i * 2654435761u) % 256);
  }
  return tokens;
}

class GptLayout : public ::testing::TestWithParam<bool> {};

TEST_P(GptLayout, UnitsMatchTheConfigsParameterCount) {
  const runtime::ModelConfig config = small_config(GetParam());
  const std::vector<UnitSpec> units = gpt_units(config);
  ASSERT_EQ(units.size(), config.layers + 2u);
  EXPECT_EQ(units.front().name, "embed");
  EXPECT_EQ(units[1].name, "h.0");
  EXPECT_EQ(units.back().name, "head");
  EXPECT_EQ(units.back().reads_embedding, GetParam());
  EXPECT_EQ(units.back().tensors.size(), GetParam() ? 2u : 3u);
  std::size_t total = 0;
  for (const UnitSpec& unit : units) {
    std::size_t offset = 0;
    for (const TensorSpec& tensor : unit.tensors) {
      EXPECT_EQ(tensor.offset, offset) << tensor.name;
      offset += tensor.numel();
    }
    EXPECT_EQ(unit.numel, offset) << unit.name;
    total += unit.numel;
  }
  EXPECT_EQ(total, runtime::gpt_parameter_count(config));
}

INSTANTIATE_TEST_SUITE_P(Head, GptLayout, ::testing::Bool());

TEST(GptInit, FollowsGpt2AndSlicesAgreeWithTheWhole) {
  const runtime::ModelConfig config = small_config(true);
  const ParameterStore params = ParameterStore::initialized(gpt_units(config), 99);
  auto stddev = [](std::span<const float> values) {
    double sum_sq = 0.0;
    for (const float v : values) {
      sum_sq += static_cast<double>(v) * v;
    }
    return std::sqrt(sum_sq / static_cast<double>(values.size()));
  };
  EXPECT_NEAR(stddev(params.find("h.1.attn.c_attn.weight")), 0.02, 0.001);
  EXPECT_NEAR(stddev(params.find("h.1.mlp.c_proj.weight")), 0.02 / std::sqrt(6.0), 0.0005);
  EXPECT_NEAR(stddev(params.find("wte.weight")), 0.02, 0.001);
  for (const float v : params.find("h.2.ln_2.weight")) {
    ASSERT_EQ(v, 1.0f);
  }
  for (const float v : params.find("h.2.mlp.c_fc.bias")) {
    ASSERT_EQ(v, 0.0f);
  }
  // An Engine initialising only its shard [100, 300) of a tensor gets the same bits.
  const TensorSpec* spec = params.find_spec("h.0.attn.c_proj.weight");
  ASSERT_NE(spec, nullptr);
  std::vector<float> slice(200);
  initialize_tensor("h.0", *spec, 99, slice, 100);
  const std::span<const float> whole = params.find("h.0.attn.c_proj.weight");
  for (std::size_t i = 0; i < slice.size(); ++i) {
    ASSERT_EQ(slice[i], whole[100 + i]);
  }
  // A shard of a unit's flat buffer that crosses tensor boundaries (ln_1 | c_attn | ...).
  const UnitSpec& block = params.units()[1];
  std::vector<float> shard(block.numel / 3);
  const std::size_t shard_begin = 40;
  initialize_unit_range(block, 99, shard, shard_begin);
  for (std::size_t i = 0; i < shard.size(); ++i) {
    ASSERT_EQ(shard[i], params.unit(1)[shard_begin + i]) << "element " << shard_begin + i;
  }
}

TEST(GptModel, RejectsImpossibleShapesAndTokensOutsideTheVocabulary) {
  runtime::ModelConfig config = small_config(true);
  config.heads = 5;
  EXPECT_THROW(GptModel{config}, std::invalid_argument);
  GptModel model(small_config(true));
  std::vector<std::int32_t> tokens = some_tokens(model.batch_tokens());
  tokens[77] = 256;
  try {
    model.set_batch(tokens);
    FAIL() << "accepted token 256 with vocab 256";
  } catch (const std::out_of_range& error) {
    EXPECT_NE(std::string(error.what()).find("position 77"), std::string::npos) << error.what();
  }
}

class GptDeterminism : public ::testing::TestWithParam<bool> {};

TEST_P(GptDeterminism, RepeatedStepsGiveBitwiseIdenticalLossAndGradients) {
  set_blas_threads(2);
  GptModel model(small_config(GetParam()));
  const ParameterStore params = ParameterStore::initialized(model.units(), 5);
  ParameterStore first(model.units());
  ParameterStore second(model.units());
  second.fill(123.0f);  // backward overwrites, never accumulates into, the gradient buffers
  const std::vector<std::int32_t> tokens = some_tokens(model.batch_tokens());
  const double loss_first = forward_backward(model, params, first, tokens);
  const double loss_second = forward_backward(model, params, second, tokens);
  EXPECT_EQ(loss_first, loss_second);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    for (std::size_t i = 0; i < first.unit(u).size(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(first.unit(u)[i]),
                std::bit_cast<std::uint32_t>(second.unit(u)[i]))
          << model.units()[u].name << " element " << i;
    }
  }
  // A batch of fewer sequences than micro_batch runs too, and gives that batch's loss.
  const std::span<const std::int32_t> half =
      std::span(tokens).first(2 * (model.config().seq_len + 1));
  EXPECT_TRUE(std::isfinite(forward_backward(model, params, first, half)));
  set_blas_threads(1);
}

INSTANTIATE_TEST_SUITE_P(Head, GptDeterminism, ::testing::Bool());

}  // namespace
}  // namespace strata::gpt
