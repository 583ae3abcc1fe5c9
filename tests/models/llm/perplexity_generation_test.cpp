// Proves strata-eval's perplexity and strata-generate's decoding: perplexity is exp of the mean
// next-token NLL computed independently from the model's logits over the documented windows
// (non-overlapping, positions restarting, a short last window of >= 2 tokens counted, of 1 not);
// greedy generation is deterministic and each token is the argmax of a full forward over the
// sequence so far; seeded sampling repeats, and top-p near 0 is greedy; weights streamed from the
// folder under any resident budget give bitwise the same logits and generations.
#include "models/inference/perplexity.hpp"

#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "models/inference/generation.hpp"
#include "models/checkpoint/host_weights.hpp"
#include "tests/models/llm/llm_io_test_support.hpp"

namespace strata::llm {
namespace {

using testing::ScratchDir;

struct TinyLlama {
  ScratchDir scratch;
  HfConfig config;
  std::optional<HostWeights> weights;

  explicit TinyLlama(Family family = Family::kLlama) {
    TinyModelOptions options;
    options.family = family;
    options.max_positions = 128;
    write_tiny_model(scratch.path() / "model", options);
    config = read_hf_config(scratch.path() / "model" / "config.json");
    weights.emplace(HostWeights::load(scratch.path() / "model", decoder_units(config)));
  }
};

std::vector<std::int32_t> random_tokens(std::size_t count, std::uint32_t vocab) {
  std::mt19937 generator(5);
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> tokens(count);
  for (std::int32_t& token : tokens) token = pick(generator);
  return tokens;
}

// Logits of every position of `sequence` (as inputs), from one forward of one sequence.
std::vector<float> full_logits(const HfConfig& config, const HostWeights& weights,
                               std::span<const std::int32_t> sequence) {
  DecoderOptions options;
  options.seq_len = static_cast<std::uint32_t>(sequence.size());
  DecoderModel model(config, options);
  std::vector<std::int32_t> with_target(sequence.begin(), sequence.end());
  with_target.push_back(0);  // a target for the last position; its logits are what we want
  model.set_batch(with_target, with_target.size());
  forward_all(model, weights);
  return std::vector<float>(model.logits().begin(), model.logits().end());
}

// Σ -log softmax(logits)[target] over every target of the window, in double.
double window_nll(const HfConfig& config, const HostWeights& weights,
                  std::span<const std::int32_t> window) {
  const std::vector<float> logits = full_logits(config, weights, window.first(window.size() - 1));
  double sum = 0;
  for (std::size_t p = 0; p + 1 < window.size(); ++p) {
    const std::span<const float> row(logits.data() + p * config.vocab_size, config.vocab_size);
    const double top = *std::max_element(row.begin(), row.end());
    double total = 0;
    for (float v : row) total += std::exp(v - top);
    sum -= row[window[p + 1]] - top - std::log(total);
  }
  return sum;
}

TEST(Perplexity, IsExpOfTheMeanNllOverTheDocumentedWindows) {
  TinyLlama model;
  for (const std::size_t count : {100u, 97u, 96u}) {  // last windows of 4, of 1 (dropped), none
    const std::vector<std::int32_t> tokens = random_tokens(count, model.config.vocab_size);
    const PerplexityResult result =
        evaluate_perplexity(model.config, *model.weights, tokens, /*window_tokens=*/32, 2);
    double nll = 0;
    std::uint64_t scored = 0;
    std::uint64_t windows = 0;
    for (std::size_t first = 0; first + 2 <= count; first += 32) {
      const std::size_t length = std::min<std::size_t>(32, count - first);
      nll += window_nll(model.config, *model.weights,
                        std::span<const std::int32_t>(tokens).subspan(first, length));
      scored += length - 1;
      ++windows;
    }
    EXPECT_EQ(result.tokens, count);
    EXPECT_EQ(result.windows, windows) << count;
    EXPECT_EQ(result.scored, scored) << count;
    EXPECT_NEAR(result.mean_nll, nll / scored, 1e-5) << count;
    EXPECT_NEAR(result.perplexity, std::exp(nll / scored), 1e-4 * result.perplexity) << count;
  }
  EXPECT_EQ(evaluate_perplexity(model.config, *model.weights, random_tokens(97, 50), 32).windows,
            3u);
  EXPECT_THROW(evaluate_perplexity(model.config, *model.weights, random_tokens(1, 50), 32),
               std::invalid_argument);
}

TEST(Generation, GreedyIsDeterministicAndTheArgmaxOfAFullForward) {
  for (const Family family : {Family::kLlama, Family::kGpt2}) {
    TinyLlama model(family);
    const std::vector<std::int32_t> prompt = {5, 17, 42, 99, 3};
    GenerationOptions options;
    options.max_new_tokens = 12;
    const std::vector<std::int32_t> ids = generate(model.config, *model.weights, prompt, options);
    ASSERT_EQ(ids.size(), 12u);
    EXPECT_EQ(generate(model.config, *model.weights, prompt, options), ids);
    std::vector<std::int32_t> sequence = prompt;
    for (const std::int32_t id : ids) {
      const std::vector<float> logits = full_logits(model.config, *model.weights, sequence);
      const auto last = logits.end() - model.config.vocab_size;
      EXPECT_EQ(id, std::max_element(last, logits.end()) - last)
          << family_name(family) << " position " << sequence.size();
      sequence.push_back(id);
    }
  }
}

TEST(Generation, SeededSamplingRepeatsAndTinyTopPIsGreedy) {
  TinyLlama model;
  const std::vector<std::int32_t> prompt = {5, 17, 42};
  GenerationOptions sampled;
  sampled.max_new_tokens = 16;
  sampled.temperature = 1.5;
  sampled.seed = 11;
  const std::vector<std::int32_t> first = generate(model.config, *model.weights, prompt, sampled);
  EXPECT_EQ(generate(model.config, *model.weights, prompt, sampled), first);
  sampled.seed = 12;
  EXPECT_NE(generate(model.config, *model.weights, prompt, sampled), first);
  sampled.top_p = 1e-9;
  GenerationOptions greedy;
  greedy.max_new_tokens = 16;
  EXPECT_EQ(generate(model.config, *model.weights, prompt, sampled),
            generate(model.config, *model.weights, prompt, greedy));
}

TEST(Generation, StopsAtAStopIdAndRefusesTooLongRequests) {
  TinyLlama model;
  const std::vector<std::int32_t> prompt = {5, 17, 42};
  GenerationOptions options;
  options.max_new_tokens = 8;
  const std::vector<std::int32_t> ids = generate(model.config, *model.weights, prompt, options);
  options.stop_ids = {ids[2]};
  const std::vector<std::int32_t> stopped = generate(model.config, *model.weights, prompt, options);
  const auto at = std::find(ids.begin(), ids.end(), ids[2]);
  EXPECT_EQ(stopped, std::vector<std::int32_t>(ids.begin(), at + 1));
  options.max_new_tokens = 126;
  EXPECT_THROW(generate(model.config, *model.weights, prompt, options), std::invalid_argument);
  EXPECT_THROW(generate(model.config, *model.weights, {}, GenerationOptions{}),
               std::invalid_argument);
}

// Budgets of nothing (every unit streamed, GPT-2's tied head reading a streamed embedding), of
// about one layer (the embedding resident or not, the rest streamed) and of everything.
TEST(HostWeightsStreaming, AnyResidentBudgetGivesBitwiseTheSameResults) {
  for (const Family family : {Family::kLlama, Family::kGpt2}) {
    TinyLlama model(family);
    const std::vector<UnitSpec> units = decoder_units(model.config);
    const std::uint64_t layer_bytes = units[1].numel * sizeof(float);
    const std::vector<std::int32_t> prompt = {5, 17, 42, 99, 3};
    GenerationOptions options;
    options.max_new_tokens = 6;
    const std::vector<float> logits = full_logits(model.config, *model.weights, prompt);
    const std::vector<std::int32_t> ids = generate(model.config, *model.weights, prompt, options);
    ASSERT_EQ(model.weights->resident_units(), units.size());
    for (const std::uint64_t budget : {std::uint64_t{0}, layer_bytes, layer_bytes * 2}) {
      const HostWeights streamed =
          HostWeights::load(model.scratch.path() / "model", units, budget);
      EXPECT_LE(streamed.resident_bytes(), budget);
      EXPECT_LT(streamed.resident_units(), units.size());
      if (budget > 0) {
        EXPECT_GT(streamed.resident_units(), 0u);
      }
      const std::vector<float> again = full_logits(model.config, streamed, prompt);
      ASSERT_EQ(again.size(), logits.size());
      EXPECT_EQ(std::memcmp(again.data(), logits.data(), logits.size() * sizeof(float)), 0)
          << family_name(family) << ", budget " << budget;
      EXPECT_EQ(generate(model.config, streamed, prompt, options), ids)
          << family_name(family) << ", budget " << budget;
    }
  }
  EXPECT_EQ(parse_resident_budget("1KiB"), 1024u);
  EXPECT_EQ(parse_resident_budget("auto"), default_resident_budget());
  EXPECT_THROW(parse_resident_budget("lots"), std::invalid_argument);
}

}  // namespace
}  // namespace strata::llm
